package runlock

// A scripted fake agent, for what the real one rarely sends: a refusal
// before welcome, unknown events and fields, a lost event in the same read
// as the grant, an oversized frame, another protocol version.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"
)

func welcomeMessage() *Map {
	return NewMap().Set("type", "welcome").Set("version", uint64(1)).Set("agent", "fake 0").Set("agent_id", "fake").
		Set("backend", "memory://").Set("scope", "host").Set("default_ttl_ms", uint64(60000))
}

func grantMessage(id interface{}) *Map {
	lease := NewMap().Set("key", "k").Set("lease_id", "l1").Set("token", uint64(7))
	return NewMap().Set("id", id).Set("type", "acquired").Set("leases", []interface{}{lease}).Set("ttl_ms", uint64(60000))
}

// fakeAgent serves connections on a socket of its own: script gets each
// request and writes what it likes, in one write (so several frames
// arrive together).
func fakeAgent(t *testing.T, script func(request *Map) [][]byte) string {
	path := filepath.Join(t.TempDir(), "fake.sock")
	listener, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close() })
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				for {
					body, err := ReadFrame(conn)
					if err != nil {
						return
					}
					request, err := DecodeBody(body)
					if err != nil {
						t.Error(err)
						return
					}
					if _, err := conn.Write(bytes.Join(script(request), nil)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return path
}

func frames(t *testing.T, messages ...*Map) [][]byte {
	var out [][]byte
	for _, m := range messages {
		frame, err := EncodeFrame(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, frame)
	}
	return out
}

func requestType(m *Map) string {
	kind, _ := m.Get("type")
	s, _ := kind.(string)
	return s
}

func requestID(m *Map) interface{} {
	id, _ := m.Get("id")
	return id
}

func TestARefusalBeforeWelcomeIsTheAgentsAnswer(t *testing.T) {
	busy := fakeAgent(t, func(*Map) [][]byte {
		return frames(t, NewMap().Set("type", "error").Set("code", "unavailable").Set("message", "agent busy: connections"))
	})
	_, err := Client{Socket: busy}.Lock(ctx(t), []string{"k"}, LockOptions{})
	var refusal *Error
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &refusal) || refusal.Code != "unavailable" {
		t.Errorf("busy: %v", err)
	}
	newer := fakeAgent(t, func(*Map) [][]byte {
		return frames(t, NewMap().Set("type", "error").Set("code", "unsupported_version").Set("message", "speaks 2"))
	})
	if _, err := (Client{Socket: newer}).Inspect(ctx(t), "k"); !errors.Is(err, ErrProtocol) {
		t.Errorf("another version: %v", err)
	}
}

func TestUnknownEventsAndFieldsAreIgnoredAndALossInTheGrantsReadIsKept(t *testing.T) {
	socket := fakeAgent(t, func(request *Map) [][]byte {
		switch requestType(request) {
		case "hello":
			return frames(t, welcomeMessage().Set("shiny", NewMap().Set("new", []interface{}{uint64(1)})))
		case "acquire":
			return frames(t,
				NewMap().Set("type", "moved").Set("to", "elsewhere"), // a newer agent's event
				grantMessage(requestID(request)).Set("extra", "ignored"),
				NewMap().Set("type", "lost").Set("lease_id", "l1").Set("key", "k").Set("reason", "quarantined").Set("message", "a newer reason"),
			)
		}
		return frames(t, NewMap().Set("id", requestID(request)).Set("type", "released").Set("count", uint64(0)))
	})
	lease, err := Client{Socket: socket}.Lock(ctx(t), []string{"k"}, LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Token() != 7 {
		t.Errorf("token %d", lease.Token())
	}
	select {
	case <-lease.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the loss that came with the grant was dropped")
	}
	var lost *LockLost
	if err := lease.Release(ctx(t)); !errors.As(err, &lost) || lost.Events[0].Reason != "quarantined" {
		t.Errorf("release: %v", err)
	}
}

func TestAnUnknownErrorCodeIsStillAFailure(t *testing.T) {
	socket := fakeAgent(t, func(request *Map) [][]byte {
		if requestType(request) == "hello" {
			return frames(t, welcomeMessage())
		}
		return frames(t, NewMap().Set("id", requestID(request)).Set("type", "error").Set("code", "quota_exceeded").Set("message", "too many"))
	})
	_, err := Client{Socket: socket}.Inspect(ctx(t), "k")
	var agentError *Error
	if !errors.As(err, &agentError) || agentError.Code != "quota_exceeded" || errors.Is(err, ErrHeld) || errors.Is(err, ErrUnavailable) {
		t.Errorf("unknown code: %v", err)
	}
}

func TestAnOversizedFrameFromTheAgentIsALoss(t *testing.T) {
	socket := fakeAgent(t, func(request *Map) [][]byte {
		if requestType(request) == "hello" {
			return frames(t, welcomeMessage())
		}
		var head [4]byte
		binary.BigEndian.PutUint32(head[:], MaxBodyLen+1)
		return append(frames(t, grantMessage(requestID(request))), head[:])
	})
	lease, err := Client{Socket: socket}.Lock(context.Background(), []string{"k"}, LockOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("no loss")
	}
	var lost *LockLost
	if err := lease.Err(); !errors.As(err, &lost) || lost.Events[0].Reason != "agent_gone" {
		t.Errorf("loss: %v", err)
	}
}
