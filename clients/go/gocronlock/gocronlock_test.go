package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"runlock"
)

// gocronLocker is gocron's Locker with this package's Lock for gocron.Lock
// (the same method set): Locker must keep that shape.
type gocronLocker interface {
	Lock(ctx context.Context, key string) (Lock, error)
}

var _ gocronLocker = (*Locker)(nil)

// agent runs a runlockd ($RUNLOCKD, which run-tests.sh sets) on memory://.
func agent(t *testing.T) string {
	binary := os.Getenv("RUNLOCKD")
	if binary == "" {
		t.Fatal("RUNLOCKD is not set (clients/go/run-tests.sh sets it)")
	}
	dir, err := os.MkdirTemp("/tmp", "runlock-gocron-")
	if err != nil {
		t.Fatal(err)
	}
	socket, config := filepath.Join(dir, "agent.sock"), filepath.Join(dir, "agent.toml")
	if err := os.WriteFile(config, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	proc := exec.Command(binary, "--config", config, "--socket", socket, "--backend", "memory://")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = proc.Process.Signal(syscall.SIGTERM)
		_ = proc.Wait()
		os.RemoveAll(dir)
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if probe, err := net.Dial("unix", socket); err == nil {
			probe.Close()
			return socket
		}
		if time.Now().After(deadline) {
			t.Fatal("runlockd did not listen within 20 s")
		}
	}
}

// Two schedulers meeting at each of three ticks, as gocron's executor uses a
// Locker: Lock before the run (an error skips it), Unlock after. Exactly one
// runs each tick, and each run sees a token larger than the last.
func TestOneSchedulerRunsEachTick(t *testing.T) {
	socket := agent(t)
	schedulers := []*Locker{
		{Client: runlock.Client{Socket: socket}, Prefix: "jobs:"},
		{Client: runlock.Client{Socket: socket}, Prefix: "jobs:"},
	}
	var lastToken uint64
	for tick := 0; tick < 3; tick++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		ran, skipped := 0, 0
		hold := make(chan struct{})
		for _, locker := range schedulers {
			locker := locker
			wg.Add(1)
			go func() {
				defer wg.Done()
				lock, err := locker.Lock(context.Background(), "nightly")
				if err != nil {
					if !errors.Is(err, runlock.ErrHeld) {
						t.Errorf("tick %d: %v", tick, err)
					}
					mu.Lock()
					skipped++
					mu.Unlock()
					close(hold) // the other one runs: let it finish
					return
				}
				lease := locker.Lease("nightly")
				if lease == nil || lease.Key() != "jobs:nightly" {
					t.Errorf("tick %d: lease %+v", tick, lease)
				}
				mu.Lock()
				ran++
				if lease.Token() <= lastToken {
					t.Errorf("tick %d: token %d after %d", tick, lease.Token(), lastToken)
				}
				lastToken = lease.Token()
				mu.Unlock()
				select {
				case <-hold: // the other scheduler was refused while this one ran
				case <-time.After(10 * time.Second):
					t.Errorf("tick %d: the other scheduler was never refused", tick)
				}
				if err := lock.Unlock(context.Background()); err != nil {
					t.Errorf("tick %d: unlock: %v", tick, err)
				}
				if locker.Lease("nightly") != nil {
					t.Errorf("tick %d: a lease kept after Unlock", tick)
				}
			}()
		}
		wg.Wait()
		if ran != 1 || skipped != 1 {
			t.Fatalf("tick %d: %d ran, %d skipped", tick, ran, skipped)
		}
	}
}

// breakInBackground breaks key; the agent answers once the run holding it
// has stopped (its Unlock), so the answer comes on the channel.
func breakInBackground(client runlock.Client, key string) <-chan error {
	done := make(chan error, 1)
	go func() {
		n, err := client.Break(context.Background(), key, runlock.BreakOptions{})
		if err == nil && n != 1 {
			err = fmt.Errorf("%d broken", n)
		}
		done <- err
	}()
	return done
}

func TestALossDuringTheRunIsToldAtUnlockOrToOnLost(t *testing.T) {
	socket := agent(t)
	client := runlock.Client{Socket: socket}
	plain := &Locker{Client: client}
	lock, err := plain.Lock(context.Background(), "report")
	if err != nil {
		t.Fatal(err)
	}
	broken := breakInBackground(client, "report")
	<-plain.Lease("report").Context().Done()
	if err := lock.Unlock(context.Background()); !errors.Is(err, runlock.ErrLockLost) {
		t.Errorf("unlock after a break: %v", err)
	}
	if err := <-broken; err != nil {
		t.Fatal(err)
	}

	told := make(chan string, 1)
	charged := &Locker{Client: client, OnLost: func(key string, event runlock.LostEvent) { told <- key + " " + event.Reason }}
	lock, err = charged.Lock(context.Background(), "report")
	if err != nil {
		t.Fatal(err)
	}
	broken = breakInBackground(client, "report")
	select {
	case got := <-told:
		if got != "report broken" {
			t.Errorf("OnLost: %s", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnLost was not called")
	}
	if err := lock.Unlock(context.Background()); err != nil {
		t.Errorf("unlock with OnLost: %v", err)
	}
	if err := <-broken; err != nil {
		t.Fatal(err)
	}
}

func TestNoAgentMeansNoRun(t *testing.T) {
	locker := &Locker{Client: runlock.Client{Socket: filepath.Join(t.TempDir(), "none.sock")}}
	if _, err := locker.Lock(context.Background(), "nightly"); !errors.Is(err, runlock.ErrUnavailable) {
		t.Errorf("without an agent: %v", err)
	}
}
