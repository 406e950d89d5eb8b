package runlock

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// LockOptions are how Lock takes its keys.
type LockOptions struct {
	// Wait is how long to wait while a key is held: 0 fails with ErrHeld at
	// once, otherwise ErrTimeout after waiting. Whole milliseconds.
	Wait time.Duration
	// TTL is the leases' time to live, 1 s to 24 h; 0 uses the agent's
	// default. The agent renews them while the connection is open.
	TTL time.Duration
	// Force takes the keys from their holders (force rights); Lock returns
	// once each displaced run has stopped or its deadline has passed.
	Force bool
	// Slots is how many holders each key admits at once, 1 to 64 (0 or 1: a plain key).
	Slots uint32
	// Command is recorded in the holder; this process's command line by default.
	Command string
	// OnLost is called once per lost lease. With it, Release does not return
	// the loss: the caller has taken charge of it.
	OnLost func(LostEvent)
	// OnRenewed is called when the agent reports a renewal (where leases can outlive it).
	OnRenewed func(Renewed)
	// OnForcing is called when a forced acquire waits for a displaced run to stop.
	OnForcing func(Forcing)
}

// Lease holds one or more keys for as long as its connection is open. A loss
// cannot go unseen: Lost() is closed and Context() cancelled, Err() returns
// the *LockLost, and Release returns it unless OnLost was given. Callbacks
// run on a goroutine of the lease's own, in order, so they may call Release.
type Lease struct {
	// Grants has one grant per key, in sorted key order.
	Grants []Grant
	// TTL is the TTL the agent applied.
	TTL time.Duration
	// Agent is the agent's welcome: backend, scope, whether leases outlive it.
	Agent Welcome

	conn    *connection
	opts    LockOptions
	ctx     context.Context
	cancel  context.CancelFunc
	lostCh  chan struct{}
	calls   serial
	mu      sync.Mutex
	active  map[string]Grant
	lost    []LostEvent
	valid   *uint64
	once    sync.Once
	release error
}

// Key is the key (one key only; it panics for several: use Grants).
func (l *Lease) Key() string { return l.single().Key }

// Token is the fencing token (one key only): hand it to the work, so stale writers can be refused.
func (l *Lease) Token() uint64 { return l.single().Token }

// LeaseID is the lease id (one key only).
func (l *Lease) LeaseID() string { return l.single().LeaseID }

// Slot is the slot held, for a key taken with slots (one key only).
func (l *Lease) Slot() *uint32 { return l.single().Slot }

// Tokens is the fencing token of each key.
func (l *Lease) Tokens() map[string]uint64 {
	tokens := map[string]uint64{}
	for _, g := range l.Grants {
		tokens[g.Key] = g.Token
	}
	return tokens
}

// Keys are the keys held, sorted.
func (l *Lease) Keys() []string {
	keys := make([]string, len(l.Grants))
	for i, g := range l.Grants {
		keys[i] = g.Key
	}
	return keys
}

func (l *Lease) single() Grant {
	if len(l.Grants) != 1 {
		panic(fmt.Sprintf("runlock: this lease holds %d keys; use Grants or Tokens", len(l.Grants)))
	}
	return l.Grants[0]
}

// Lost is closed when a lease is lost.
func (l *Lease) Lost() <-chan struct{} { return l.lostCh }

// Context is cancelled when a lease is lost (Err then says why) or released:
// give it to the work the lease protects.
func (l *Lease) Context() context.Context { return l.ctx }

// Err is the *LockLost once a lease is lost, nil before.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lost) == 0 {
		return nil
	}
	return &LockLost{Events: append([]LostEvent(nil), l.lost...)}
}

// ValidFor is the guarantee the agent last reported (acquired, then each
// renewal), where leases outlive it; nil elsewhere.
func (l *Lease) ValidFor() *time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.valid == nil {
		return nil
	}
	d := time.Duration(*l.valid) * time.Millisecond
	return &d
}

func (l *Lease) onEvent(msg *agentMessage) {
	switch {
	case msg.Lost != nil:
		l.mu.Lock()
		_, held := l.active[msg.Lost.LeaseID]
		delete(l.active, msg.Lost.LeaseID)
		l.mu.Unlock()
		if held {
			l.lose(*msg.Lost)
		}
	case msg.Renewed != nil:
		l.mu.Lock()
		_, held := l.active[msg.Renewed.LeaseID]
		if held {
			valid := msg.Renewed.ValidForMs
			l.valid = &valid
		}
		l.mu.Unlock()
		if held && l.opts.OnRenewed != nil {
			renewed := *msg.Renewed
			l.calls.do(func() { l.opts.OnRenewed(renewed) })
		}
	}
}

// onEnd: this client does not reattach, so an agent that goes away takes
// the leases with it.
func (l *Lease) onEnd(restarting bool, err error) {
	reason := "agent_gone"
	if restarting {
		reason = "restarting"
	}
	l.mu.Lock()
	var gone []LostEvent
	for id, g := range l.active {
		gone = append(gone, LostEvent{LeaseID: id, Key: g.Key, Reason: reason, Message: err.Error()})
	}
	l.active = map[string]Grant{}
	l.mu.Unlock()
	sort.Slice(gone, func(i, j int) bool { return gone[i].Key < gone[j].Key })
	for _, event := range gone {
		l.lose(event)
	}
}

func (l *Lease) lose(event LostEvent) {
	l.mu.Lock()
	l.lost = append(l.lost, event)
	first := len(l.lost) == 1
	l.mu.Unlock()
	if first {
		close(l.lostCh)
		l.cancel()
	}
	if l.opts.OnLost != nil {
		l.calls.do(func() { l.opts.OnLost(event) })
	}
}

// Release releases what is still held and closes the connection; it may be
// called more than once. It returns the *LockLost if a lease was lost and
// no OnLost was given.
func (l *Lease) Release(ctx context.Context) error {
	l.once.Do(func() { l.release = l.releaseOnce(ctx) })
	return l.release
}

func (l *Lease) releaseOnce(ctx context.Context) error {
	l.mu.Lock()
	ids := make([]string, 0, len(l.active))
	for id := range l.active {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	var err error
	if len(ids) > 0 && !l.conn.closed() {
		sort.Strings(ids)
		var msg *agentMessage
		msg, err = l.conn.request(ctx, func(id uint64) *Map { return releaseRequest(id, ids) }, replySlack, false)
		if err == nil {
			err = expect(msg, "released")
		}
		if err == nil {
			l.mu.Lock()
			l.active = map[string]Grant{}
			l.mu.Unlock()
		}
	}
	l.conn.close() // frees anything a failed release left held
	l.cancel()
	if err != nil {
		return err
	}
	if lost := l.Err(); lost != nil && l.opts.OnLost == nil {
		return lost
	}
	return nil
}

func millis(d time.Duration, what string) (*uint64, error) {
	if d == 0 {
		return nil, nil
	}
	if d < 0 || d%time.Millisecond != 0 {
		return nil, fmt.Errorf("runlock: %s must be a non-negative whole number of milliseconds, got %s", what, d)
	}
	ms := uint64(d / time.Millisecond)
	return &ms, nil
}

var plainWord = regexp.MustCompile(`^[\w@%+=:,./-]+$`)

// defaultCommand is this process's command line, shell-quoted.
func defaultCommand() string {
	words := make([]string, len(os.Args))
	for i, word := range os.Args {
		if plainWord.MatchString(word) {
			words[i] = word
		} else {
			words[i] = "'" + strings.ReplaceAll(word, "'", `'"'"'`) + "'"
		}
	}
	return strings.Join(words, " ")
}

// Lock takes keys (all, in sorted order, or none) and returns the Lease. ctx
// bounds the wait for the keys, not the lease: the lease lasts until
// Release, a loss, or the end of this process.
func (c Client) Lock(ctx context.Context, keys []string, opts LockOptions) (*Lease, error) {
	wait, err := millis(opts.Wait, "Wait")
	if err != nil {
		return nil, err
	}
	ttl, err := millis(opts.TTL, "TTL")
	if err != nil {
		return nil, err
	}
	fields := acquireFields{TTLMs: ttl, WaitMs: wait, Command: opts.Command, Slots: opts.Slots}
	if opts.Force {
		force := true
		fields.Force = &force
	}
	if fields.Command == "" {
		fields.Command = defaultCommand()
	}
	conn, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	// Events before the lease is built (a lost may come in the same read as
	// the grant) wait for it.
	var earlyMu sync.Mutex
	var early []*agentMessage
	conn.setHandlers(func(msg *agentMessage) {
		if msg.Forcing != nil {
			if opts.OnForcing != nil {
				opts.OnForcing(*msg.Forcing)
			}
			return
		}
		earlyMu.Lock()
		early = append(early, msg)
		earlyMu.Unlock()
	}, nil)
	msg, err := conn.request(ctx, func(id uint64) *Map { return acquireRequest(id, keys, fields) }, opts.Wait+replySlack, true)
	if err == nil {
		err = expect(msg, "acquired")
	}
	if err != nil {
		conn.close()
		return nil, err
	}
	lease := &Lease{
		Grants: msg.Grants, TTL: time.Duration(msg.TTLMs) * time.Millisecond, Agent: conn.welcome,
		conn: conn, opts: opts, lostCh: make(chan struct{}),
		active: map[string]Grant{}, valid: msg.ValidFor,
	}
	lease.ctx, lease.cancel = context.WithCancel(context.Background())
	for _, g := range msg.Grants {
		lease.active[g.LeaseID] = g
	}
	conn.setHandlers(lease.onEvent, lease.onEnd)
	earlyMu.Lock()
	for _, msg := range early {
		lease.onEvent(msg)
	}
	earlyMu.Unlock()
	if conn.closed() { // ended before the handlers were in place
		lease.onEnd(false, unavailable("the agent at %s closed the connection", conn.path))
	}
	return lease, nil
}

// WithLock runs work while holding keys, then releases them. work's context
// is cancelled if a lease is lost (or ctx ends). It returns the *LockLost if
// a lease was lost meanwhile (without OnLost), whatever work returned (its
// error is then the LockLost's Cause).
func (c Client) WithLock(ctx context.Context, keys []string, opts LockOptions, work func(context.Context, *Lease) error) error {
	lease, err := c.Lock(ctx, keys, opts)
	if err != nil {
		return err
	}
	workCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lease.Lost():
			cancel()
		case <-workCtx.Done():
		}
	}()
	workErr := work(workCtx, lease)
	if err := lease.Release(context.Background()); err != nil {
		if lost, ok := err.(*LockLost); ok {
			return &LockLost{Events: lost.Events, Cause: workErr}
		}
		if workErr == nil {
			return err
		}
	}
	return workErr
}

// serial runs the calls given to it one after the other, in order, on a
// goroutine of its own: a callback may then call Release, which waits on the
// connection's reader, without a deadlock.
type serial struct {
	mu      sync.Mutex
	queue   []func()
	running bool
}

func (s *serial) do(call func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, call)
	if !s.running {
		s.running = true
		go s.run()
	}
}

func (s *serial) run() {
	for {
		s.mu.Lock()
		if len(s.queue) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		call := s.queue[0]
		s.queue = s.queue[1:]
		s.mu.Unlock()
		call()
	}
}
