package runlock

// The client against a real runlockd, on memory:// and on file://.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// crashReleaseBound is how soon a killed holder's key must be free: the
// shim's bound (tests/shim/crash_release.rs).
const crashReleaseBound = 5 * time.Second

// holderEnv makes the test binary a process that takes a key and holds it
// until killed: the crash test's victim.
const holderEnv = "RUNLOCK_GO_TEST_HOLDER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(holderEnv); spec != "" {
		socket, key, _ := strings.Cut(spec, "\n")
		lease, err := Client{Socket: socket}.Lock(context.Background(), []string{key}, LockOptions{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("held %d\n", lease.Token())
		select {}
	}
	os.Exit(m.Run())
}

var backends = []string{"memory", "file"}

// eachBackend runs body against a fresh agent on each backend.
func eachBackend(t *testing.T, body func(t *testing.T, c Client)) {
	for _, backend := range backends {
		backend := backend
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			body(t, Client{Socket: startAgent(t, backend).socket})
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func mustLock(t *testing.T, c Client, opts LockOptions, keys ...string) *Lease {
	t.Helper()
	lease, err := c.Lock(ctx(t), keys, opts)
	if err != nil {
		t.Fatalf("lock %v: %v", keys, err)
	}
	return lease
}

func mustRelease(t *testing.T, lease *Lease) {
	t.Helper()
	if err := lease.Release(ctx(t)); err != nil {
		t.Fatalf("release: %v", err)
	}
}

func TestLockAndReleaseWithAGrowingToken(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		first := mustLock(t, c, LockOptions{}, "dev:a")
		if first.Token() < 1 || first.LeaseID() == "" || first.Slot() != nil || first.Key() != "dev:a" {
			t.Errorf("lease: %+v", first.Grants)
		}
		mustRelease(t, first)
		mustRelease(t, first) // again: nothing more
		second := mustLock(t, c, LockOptions{TTL: 5 * time.Second}, "dev:a")
		if second.Token() <= first.Token() || second.TTL != 5*time.Second {
			t.Errorf("token %d after %d, TTL %s", second.Token(), first.Token(), second.TTL)
		}
		select {
		case <-second.Context().Done():
			t.Error("a held lease's context is done")
		default:
		}
		mustRelease(t, second)
		if second.Context().Err() == nil || second.Err() != nil {
			t.Errorf("after release: context %v, loss %v", second.Context().Err(), second.Err())
		}
	})
}

func TestSeveralKeysAllOrNone(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		lease := mustLock(t, c, LockOptions{}, "dev:b", "dev:a")
		if !reflect.DeepEqual(lease.Keys(), []string{"dev:a", "dev:b"}) || len(lease.Tokens()) != 2 {
			t.Errorf("keys %v tokens %v", lease.Keys(), lease.Tokens())
		}
		if _, err := c.Lock(ctx(t), []string{"dev:c", "dev:b"}, LockOptions{}); !errors.Is(err, ErrHeld) {
			t.Errorf("dev:b taken twice: %v", err)
		}
		if record, err := c.Inspect(ctx(t), "dev:c"); err != nil || record.State != "free" {
			t.Errorf("dev:c kept after a refusal: %+v %v", record, err)
		}
		mustRelease(t, lease)
	})
}

func TestAHeldKeyIsRefusedNamingItsHolder(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		lease := mustLock(t, c, LockOptions{Command: "etl nightly"}, "dev:a")
		_, err := c.Lock(ctx(t), []string{"dev:a"}, LockOptions{})
		var refusal *Error
		if !errors.As(err, &refusal) || !errors.Is(err, ErrHeld) || errors.Is(err, ErrTimeout) {
			t.Fatalf("not held: %v", err)
		}
		h := refusal.Holder
		if h.PID != uint32(os.Getpid()) || h.Token != lease.Token() || h.Command != "etl nightly" {
			t.Errorf("holder: %+v", h)
		}
		mustRelease(t, lease)
	})
}

func TestWaitingTimesOutOrIsWokenByARelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		lease := mustLock(t, c, LockOptions{}, "dev:a")
		_, err := c.Lock(ctx(t), []string{"dev:a"}, LockOptions{Wait: 200 * time.Millisecond})
		var refusal *Error
		if !errors.Is(err, ErrTimeout) || !errors.As(err, &refusal) || refusal.Holder.Token != lease.Token() {
			t.Fatalf("not a timeout naming the holder: %v", err)
		}
		got := make(chan *Lease, 1)
		go func() {
			next, err := c.Lock(ctx(t), []string{"dev:a"}, LockOptions{Wait: 30 * time.Second})
			if err != nil {
				t.Error(err)
			}
			got <- next
		}()
		// The waiter is queued once the agent's listing shows it waiting.
		until(t, func() bool {
			waiting := false
			_ = c.ListKeys(ctx(t), "dev:a", ListKeysOptions{}, func(k KeyListing) bool { waiting = k.WaitingHere == 1; return false })
			return waiting
		})
		mustRelease(t, lease)
		next := <-got
		if next == nil || next.Token() <= lease.Token() {
			t.Fatalf("the waiter: %+v", next)
		}
		mustRelease(t, next)
	})
}

func TestAForcedHolderIsToldEveryWay(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		holder := mustLock(t, c, LockOptions{}, "dev:a")
		var mu sync.Mutex
		var forcing []Forcing
		// The forced grant comes once the displaced run has stopped: its release below.
		forced := make(chan *Lease, 1)
		go func() {
			forcer, err := c.Lock(ctx(t), []string{"dev:a"}, LockOptions{Force: true, OnForcing: func(f Forcing) {
				mu.Lock()
				forcing = append(forcing, f)
				mu.Unlock()
			}})
			if err != nil {
				t.Error(err)
			}
			forced <- forcer
		}()
		select {
		case <-holder.Lost():
		case <-time.After(10 * time.Second):
			t.Fatal("the forced holder's Lost() was not closed")
		}
		<-holder.Context().Done()
		var lost *LockLost
		if err := holder.Err(); !errors.As(err, &lost) || lost.Events[0].Reason != "forced" {
			t.Errorf("loss: %v", err)
		}
		if err := holder.Release(ctx(t)); !errors.Is(err, ErrLockLost) {
			t.Errorf("release after a loss without OnLost: %v", err)
		}
		forcer := <-forced
		if forcer == nil {
			t.FailNow()
		}
		if lost.Events[0].Holder.Token != forcer.Token() || forcer.Token() <= holder.Token() {
			t.Errorf("tokens: forced %d, new holder %+v", forcer.Token(), lost.Events[0].Holder)
		}
		mu.Lock()
		if len(forcing) != 1 || forcing[0].Key != "dev:a" || forcing[0].Holder.Token != holder.Token() {
			t.Errorf("forcing: %+v", forcing)
		}
		mu.Unlock()
		if record, err := c.Inspect(ctx(t), "dev:a"); err != nil || record.Holder.Token != forcer.Token() {
			t.Errorf("record: %+v %v", record, err)
		}
		mustRelease(t, forcer)
	})
}

func TestOnLostTakesChargeAndMayRelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		seen := make(chan LostEvent, 1)
		var holder *Lease
		holder = mustLock(t, c, LockOptions{OnLost: func(e LostEvent) {
			// Release from the callback: it must not wait on itself.
			if err := holder.Release(context.Background()); err != nil {
				t.Errorf("release from OnLost: %v", err)
			}
			seen <- e
		}}, "dev:a")
		if n, err := c.Break(ctx(t), "dev:a", BreakOptions{}); err != nil || n != 1 {
			t.Fatalf("break: %d %v", n, err)
		}
		select {
		case e := <-seen:
			if e.Reason != "broken" {
				t.Errorf("reason %s", e.Reason)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("OnLost was not called")
		}
		if n, err := c.Break(ctx(t), "dev:a", BreakOptions{}); err != nil || n != 0 {
			t.Errorf("a free key broken: %d %v", n, err)
		}
	})
}

func TestWithLockReleasesAndReportsALoss(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		err := c.WithLock(ctx(t), []string{"dev:a"}, LockOptions{}, func(context.Context, *Lease) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		if record, _ := c.Inspect(ctx(t), "dev:a"); record.State != "free" {
			t.Errorf("kept after WithLock: %+v", record)
		}
		workErr := errors.New("stopped")
		broken := make(chan error, 1)
		err = c.WithLock(ctx(t), []string{"dev:a"}, LockOptions{}, func(work context.Context, _ *Lease) error {
			go func() { // answered once this run has stopped
				_, err := c.Break(ctx(t), "dev:a", BreakOptions{})
				broken <- err
			}()
			<-work.Done() // cancelled by the loss
			return workErr
		})
		if err := <-broken; err != nil {
			t.Errorf("break: %v", err)
		}
		var lost *LockLost
		if !errors.As(err, &lost) || lost.Events[0].Reason != "broken" || !errors.Is(err, workErr) {
			t.Errorf("WithLock after a break: %v", err)
		}
	})
}

func TestStatusInspectHistoryAndListKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		lease := mustLock(t, c, LockOptions{Command: "etl run"}, "dev:a")
		leases, omitted, err := c.Status(ctx(t))
		if err != nil || omitted != 0 || len(leases) != 1 || leases[0].LeaseID != lease.LeaseID() || leases[0].Holder.Token != lease.Token() {
			t.Errorf("status: %+v %d %v", leases, omitted, err)
		}
		record, err := c.Inspect(ctx(t), "dev:a")
		if err != nil || record.State != "held" || record.Holder.Command != "etl run" || record.Scope != "host" {
			t.Errorf("inspect: %+v %v", record, err)
		}
		mustRelease(t, lease)
		events, err := c.History(ctx(t), "dev:a", 0)
		if err != nil || len(events) != 2 || events[0].Kind != "granted" || events[1].Kind != "released" || events[1].Token != lease.Token() {
			t.Errorf("history: %+v %v", events, err)
		}
		if last, err := c.History(ctx(t), "dev:a", 1); err != nil || len(last) != 1 || last[0].Kind != "released" {
			t.Errorf("history limit 1: %+v %v", last, err)
		}
		other := mustLock(t, c, LockOptions{}, "dev:b")
		var held, all []string
		if err := c.ListKeys(ctx(t), "dev:", ListKeysOptions{}, func(k KeyListing) bool { held = append(held, k.Key); return true }); err != nil {
			t.Fatal(err)
		}
		if err := c.ListKeys(ctx(t), "dev:", ListKeysOptions{Free: true}, func(k KeyListing) bool {
			all = append(all, k.Key+" "+k.Record.State)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		sort.Strings(all)
		if !reflect.DeepEqual(held, []string{"dev:b"}) || !reflect.DeepEqual(all, []string{"dev:a free", "dev:b held"}) {
			t.Errorf("listings: %v, %v", held, all)
		}
		mustRelease(t, other)
	})
}

func TestSlots(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		var leases []*Lease
		var slots []int
		for i := 0; i < 3; i++ {
			lease := mustLock(t, c, LockOptions{Slots: 3}, "warehouse")
			leases = append(leases, lease)
			slots = append(slots, int(*lease.Slot()))
		}
		sort.Ints(slots)
		if !reflect.DeepEqual(slots, []int{0, 1, 2}) {
			t.Errorf("slots %v", slots)
		}
		_, err := c.Lock(ctx(t), []string{"warehouse"}, LockOptions{Slots: 3})
		var refusal *Error
		if !errors.Is(err, ErrHeld) || !errors.As(err, &refusal) || len(refusal.Holders) != 3 {
			t.Errorf("a fourth: %v", err)
		}
		_, err = c.Lock(ctx(t), []string{"warehouse"}, LockOptions{Slots: 2})
		if !errors.Is(err, ErrSlotsMismatch) || !errors.As(err, &refusal) || refusal.HeldWith() != 3 {
			t.Errorf("another count: %v", err)
		}
		if record, err := c.Inspect(ctx(t), "warehouse"); err != nil || *record.Slots != 3 || len(record.Holders) != 3 {
			t.Errorf("record: %+v %v", record, err)
		}
		one := uint32(1)
		broken := make(chan error, 1)
		go func() {
			n, err := c.Break(ctx(t), "warehouse", BreakOptions{Slot: &one})
			if err == nil && n != 1 {
				err = fmt.Errorf("%d broken", n)
			}
			broken <- err
		}()
		for _, lease := range leases {
			if *lease.Slot() == 1 {
				<-lease.Lost()
			}
		}
		for _, lease := range leases {
			err := lease.Release(ctx(t))
			if broken := *lease.Slot() == 1; broken != errors.Is(err, ErrLockLost) {
				t.Errorf("slot %d released: %v", *lease.Slot(), err)
			}
		}
		if err := <-broken; err != nil {
			t.Errorf("break slot 1: %v", err)
		}
	})
}

func TestBadInput(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		_, err := c.Lock(ctx(t), []string{"dev\nx"}, LockOptions{})
		var refusal *Error
		if !errors.Is(err, ErrInvalidKey) || !errors.As(err, &refusal) || refusal.Key != "dev\nx" {
			t.Errorf("invalid key: %v", err)
		}
		nowhere := Client{Socket: "/nonexistent/agent.sock"}
		for _, opts := range []LockOptions{{Wait: -time.Second}, {TTL: 1500 * time.Microsecond}} {
			if _, err := nowhere.Lock(ctx(t), []string{"k"}, opts); err == nil || errors.Is(err, ErrUnavailable) {
				t.Errorf("%+v reached the socket: %v", opts, err)
			}
		}
	})
}

func TestNoAgentIsUnavailable(t *testing.T) {
	_, err := Client{Socket: t.TempDir() + "/none.sock"}.Lock(ctx(t), []string{"k"}, LockOptions{})
	var agentError *Error
	if !errors.Is(err, ErrUnavailable) || errors.As(err, &agentError) {
		t.Errorf("no agent: %v", err)
	}
}

func TestAKilledHoldersKeyIsFreeWithinTheShimsBound(t *testing.T) {
	eachBackend(t, func(t *testing.T, c Client) {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		child := exec.Command(self)
		child.Env = append(os.Environ(), holderEnv+"="+c.Socket+"\ndev:crash")
		out, err := child.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		child.Stderr = os.Stderr
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		defer child.Process.Kill() // whatever fails below, no holder is left behind
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "held ") {
			t.Fatalf("the holder said %q (%v)", line, err)
		}
		if record, err := c.Inspect(ctx(t), "dev:crash"); err != nil || int(record.Holder.PID) != child.Process.Pid {
			t.Fatalf("record: %+v %v", record, err)
		}
		started := time.Now()
		_ = child.Process.Signal(syscall.SIGKILL)
		_ = child.Wait()
		lease := mustLock(t, c, LockOptions{Wait: 30 * time.Second}, "dev:crash")
		if took := time.Since(started); took >= crashReleaseBound {
			t.Errorf("the key was free only after %s", took)
		}
		mustRelease(t, lease)
		events, err := c.History(ctx(t), "dev:crash", 0)
		// The killed holder's grant, then its release by the agent as its client went away.
		if err != nil || len(events) < 2 || events[0].Kind != "granted" || events[1].Kind != "released" ||
			events[1].Reason != "client gone" || int(events[1].PID) != child.Process.Pid {
			t.Errorf("history: %+v %v", events, err)
		}
	})
}

func TestAnAgentThatStopsTakesTheLeaseWithIt(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			agent := startAgent(t, backend)
			lease := mustLock(t, Client{Socket: agent.socket}, LockOptions{}, "dev:a")
			agent.stop(syscall.SIGTERM)
			select {
			case <-lease.Lost():
			case <-time.After(10 * time.Second):
				t.Fatal("no loss")
			}
			var lost *LockLost
			if err := lease.Release(ctx(t)); !errors.As(err, &lost) || (lost.Events[0].Reason != "restarting" && lost.Events[0].Reason != "agent_gone") {
				t.Errorf("release: %v", err)
			}
		})
	}
}

func TestRenewalsAreToldOnS3(t *testing.T) {
	uri, env := s3Backend(t)
	agent := startAgent(t, uri, env...)
	renewals := make(chan Renewed, 16)
	lease := mustLock(t, Client{Socket: agent.socket}, LockOptions{TTL: time.Second, OnRenewed: func(r Renewed) { renewals <- r }}, "dev:renewed")
	if !lease.Agent.LeasesSurviveAgent || lease.ValidFor() == nil || *lease.ValidFor() > time.Second {
		t.Errorf("acquired: survive %v, valid for %v", lease.Agent.LeasesSurviveAgent, lease.ValidFor())
	}
	select { // the agent renews every TTL/3
	case r := <-renewals:
		if r.LeaseID != lease.LeaseID() || r.ValidForMs == 0 || r.ValidForMs > 1000 {
			t.Errorf("renewed: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal reported")
	}
	if lease.ValidFor() == nil || *lease.ValidFor() > time.Second {
		t.Errorf("valid for %v", lease.ValidFor())
	}
	mustRelease(t, lease)
}

// until polls condition every 20 ms until it holds, for at most 10 s.
func until(t *testing.T, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
