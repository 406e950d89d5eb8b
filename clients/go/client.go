// Package runlock is a client of runlockd, the runlock agent, over its Unix
// socket (protocol/SPEC.md in the runlock repository): take named locks with
// fencing tokens, learn at once when one is lost, and read who holds what.
//
//	lease, err := runlock.Client{}.Lock(ctx, []string{"dev:nightly"}, runlock.LockOptions{Wait: time.Minute})
//	if err != nil { ... }
//	defer lease.Release(context.Background())
//	run(lease.Context(), lease.Token())
package runlock

import (
	"context"
	"time"
)

// Client reaches one agent. The zero value finds the agent's socket by the
// socket rule (ResolveSocket); every call opens a connection of its own, and
// a Lease keeps its own until released.
type Client struct {
	// Socket is the agent's socket path; empty for the socket rule.
	Socket string
}

func (c Client) open(ctx context.Context) (*connection, error) {
	path, err := ResolveSocket(c.Socket)
	if err != nil {
		return nil, err
	}
	return openConnection(ctx, path)
}

// oneShot sends one request on a connection of its own.
func (c Client) oneShot(ctx context.Context, build func(uint64) *Map, kind string, timeout time.Duration, onEvent func(*agentMessage)) (*agentMessage, error) {
	conn, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.close()
	conn.setHandlers(onEvent, nil)
	msg, err := conn.request(ctx, build, timeout, onEvent != nil)
	if err != nil {
		return nil, err
	}
	return msg, expect(msg, kind)
}

// Status lists every lease held through the agent (LeaseID is "" for
// another user's), and how many more were left out to fit one frame.
func (c Client) Status(ctx context.Context) ([]LeaseInfo, uint32, error) {
	msg, err := c.oneShot(ctx, func(id uint64) *Map { return request(id, "list") }, "leases", replySlack, nil)
	if err != nil {
		return nil, 0, err
	}
	return msg.Leases, msg.Omitted, nil
}

// Inspect reads a key's record in the backend, whoever holds it, on any host.
func (c Client) Inspect(ctx context.Context, key string) (*KeyRecord, error) {
	msg, err := c.oneShot(ctx, func(id uint64) *Map { return inspectRequest(id, key) }, "record", replySlack, nil)
	if err != nil {
		return nil, err
	}
	return msg.Record, nil
}

// History reads a key's latest events, oldest first (the record keeps 32);
// limit keeps the latest that many (0: all).
func (c Client) History(ctx context.Context, key string, limit uint32) ([]KeyEvent, error) {
	msg, err := c.oneShot(ctx, func(id uint64) *Map { return historyRequest(id, key, limit) }, "events", replySlack, nil)
	if err != nil {
		return nil, err
	}
	return msg.Events, nil
}

// ListKeysOptions are what ListKeys lists.
type ListKeysOptions struct {
	// Free lists free keys too, not only held ones.
	Free bool
	// EventsSince, when not zero, includes each key's events (and refusals) since then.
	EventsSince time.Time
}

// ListKeys calls each with every host's keys under prefix, from the store, a
// page at a time; each returning false stops the listing.
func (c Client) ListKeys(ctx context.Context, prefix string, opts ListKeysOptions, each func(KeyListing) bool) error {
	conn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer conn.close()
	fields := listKeysFields{Prefix: prefix, Free: opts.Free}
	if !opts.EventsSince.IsZero() {
		since := uint64(opts.EventsSince.UnixMilli())
		fields.EventsSinceMs = &since
	}
	for {
		msg, err := conn.request(ctx, func(id uint64) *Map { return listKeysRequest(id, fields) }, listPageTimeout, false)
		if err == nil {
			err = expect(msg, "keys")
		}
		if err != nil {
			return err
		}
		for _, listing := range msg.Keys {
			if !each(listing) {
				return nil
			}
		}
		if msg.Cursor == nil {
			return nil
		}
		fields.Cursor = msg.Cursor
	}
}

// BreakOptions say which slot to break, and who hears of the wait.
type BreakOptions struct {
	// Slot breaks one slot of a key with slots; nil for the key's own record.
	Slot *uint32
	// OnForcing is called when the break waits for the broken run to stop.
	OnForcing func(Forcing)
}

// Break breaks whoever holds key (force rights needed). It returns 1 once
// that run has stopped, or 0 if the key was free.
func (c Client) Break(ctx context.Context, key string, opts BreakOptions) (uint32, error) {
	var onEvent func(*agentMessage)
	if opts.OnForcing != nil {
		onEvent = func(msg *agentMessage) {
			if msg.Forcing != nil {
				opts.OnForcing(*msg.Forcing)
			}
		}
	} else {
		onEvent = func(*agentMessage) {}
	}
	msg, err := c.oneShot(ctx, func(id uint64) *Map { return breakRequest(id, key, opts.Slot) }, "released", replySlack, onEvent)
	if err != nil {
		return 0, err
	}
	return msg.Count, nil
}
