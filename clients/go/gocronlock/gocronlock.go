// Package gocronlock is a distributed locker for gocron (github.com/go-co-op/gocron,
// v1.22 and later, and v2): a job runs only on the scheduler that takes its
// runlock key, which it holds while it runs.
//
// gocron's Locker returns gocron's own Lock type, so the Locker here
// satisfies it through a three-line wrapper in the caller's code (this
// package does not import gocron, which Debian does not package with its
// Locker):
//
//	type locker struct{ *gocronlock.Locker }
//
//	func (l locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
//		return l.Locker.Lock(ctx, key)
//	}
//
//	scheduler, _ := gocron.NewScheduler(gocron.WithDistributedLocker(locker{&gocronlock.Locker{}}))
package gocronlock

import (
	"context"
	"sync"

	"runlock"
)

// Lock is gocron's Lock: what Locker.Lock returns.
type Lock interface {
	Unlock(ctx context.Context) error
}

// Locker takes a runlock key for each run of a job.
type Locker struct {
	// Client reaches the agent (the zero value: the socket rule).
	Client runlock.Client
	// Prefix goes before gocron's key (the job's name) to make the runlock key.
	Prefix string
	// Options are how keys are taken; Wait 0 (the default) refuses at once
	// while another scheduler runs the job, which gocron then skips here.
	Options runlock.LockOptions
	// OnLost is called when a running job's lease is lost. Without it, the
	// loss is returned from Unlock, which gocron reports as an error.
	OnLost func(key string, event runlock.LostEvent)

	mu   sync.Mutex
	held map[string]*runlock.Lease
}

// Lock takes the job's key: an error (runlock.ErrHeld while another
// scheduler runs it; runlock.ErrUnavailable without an agent) tells gocron
// not to run the job here, so no run goes unprotected. The key is held until
// Unlock, or until this process dies: the agent frees it when the connection
// ends.
func (l *Locker) Lock(ctx context.Context, key string) (Lock, error) {
	opts := l.Options
	if opts.Command == "" {
		opts.Command = "gocron " + key
	}
	if l.OnLost != nil {
		opts.OnLost = func(event runlock.LostEvent) { l.OnLost(key, event) }
	}
	lease, err := l.Client.Lock(ctx, []string{l.Prefix + key}, opts)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]*runlock.Lease{}
	}
	l.held[key] = lease
	l.mu.Unlock()
	return &unlocker{locker: l, key: key, lease: lease}, nil
}

// Lease is the lease a run of the job named key holds here, while it runs:
// its Token to hand to the work, its Context that ends if the lease is lost.
func (l *Locker) Lease(key string) *runlock.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[key]
}

type unlocker struct {
	locker *Locker
	key    string
	lease  *runlock.Lease
}

// Unlock releases the key; it returns the loss if the lease was lost while
// the job ran (and no OnLost took charge of it).
func (u *unlocker) Unlock(ctx context.Context) error {
	u.locker.mu.Lock()
	if u.locker.held[u.key] == u.lease {
		delete(u.locker.held, u.key)
	}
	u.locker.mu.Unlock()
	return u.lease.Release(ctx)
}
