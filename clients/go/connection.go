package runlock

// One connection to the agent: the handshake, requests matched to replies by
// id, events handed on. It keeps nothing a crash could leak: when the process
// dies the kernel closes the socket, and the agent frees the connection's
// keys (SPEC 5.3).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// Version is this package's version, the runlock workspace's.
const Version = "0.1.0"

const clientName = "runlock-go " + Version

const (
	// helloTimeout bounds the agent's answer to hello (its own handshake bound).
	helloTimeout = 5 * time.Second
	// replySlack is how long past a request's own wait a reply may take
	// before the agent is deemed hung.
	replySlack = 30 * time.Second
	// listPageTimeout bounds one page of list_keys (up to a thousand records).
	listPageTimeout = 60 * time.Second
)

type reply struct {
	msg *agentMessage
	err error
}

type pending struct {
	done chan reply
	// extend carries a forcing event's wait to a request that can force
	// (nil: no deadline).
	extend chan *uint64
}

type connection struct {
	path    string
	sock    net.Conn
	welcome Welcome

	writeMu sync.Mutex
	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]pending
	ended   error
	// restarting: the agent said it is going away.
	restarting bool
	onEvent    func(*agentMessage)
	onEnd      func(restarting bool, err error)
}

// openConnection connects and says hello; ErrUnavailable when no agent answers.
func openConnection(ctx context.Context, path string) (*connection, error) {
	var dialer net.Dialer
	dialCtx, cancel := context.WithTimeout(ctx, helloTimeout)
	defer cancel()
	sock, err := dialer.DialContext(dialCtx, "unix", path)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, unavailable("cannot reach the agent at %s: %v", path, err)
	}
	deadline := time.Now().Add(helloTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = sock.SetDeadline(deadline)
	welcome, err := handshake(sock, path)
	if err != nil {
		sock.Close()
		return nil, err
	}
	_ = sock.SetDeadline(time.Time{})
	c := &connection{path: path, sock: sock, welcome: *welcome, pending: map[uint64]pending{}, nextID: 1}
	go c.read()
	return c, nil
}

func handshake(sock net.Conn, path string) (*Welcome, error) {
	frame, err := EncodeFrame(helloRequest(clientName, uint32(os.Getpid()), false))
	if err != nil {
		return nil, err
	}
	if _, err := sock.Write(frame); err != nil {
		return nil, unavailable("cannot send to the agent at %s: %v", path, err)
	}
	body, err := ReadFrame(sock)
	if err != nil {
		if errors.Is(err, ErrProtocol) {
			return nil, err
		}
		return nil, unavailable("the agent at %s did not answer hello: %v", path, err)
	}
	m, err := DecodeBody(body)
	if err != nil {
		return nil, err
	}
	msg, err := parseAgent(m)
	if err != nil {
		return nil, err
	}
	// An error before welcome, with or without id, is the agent's refusal (SPEC 5.1).
	if msg.Err != nil {
		return nil, msg.Err
	}
	if msg.Welcome == nil {
		return nil, protocolErr("expected welcome, got %s", msg.Type)
	}
	if msg.Welcome.Version != ProtocolVersion {
		return nil, protocolErr("the agent answered version %d", msg.Welcome.Version)
	}
	return msg.Welcome, nil
}

func (c *connection) read() {
	for {
		body, err := ReadFrame(c.sock)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				err = unavailable("the agent at %s closed the connection: %v", c.path, err)
			}
			c.end(err)
			return
		}
		m, err := DecodeBody(body)
		if err != nil {
			c.end(err)
			return
		}
		msg, err := parseAgent(m)
		if err != nil {
			if id := messageID(m); id != nil && c.settle(*id, reply{err: err}) {
				continue
			}
			c.end(err)
			return
		}
		c.dispatch(msg)
	}
}

func (c *connection) dispatch(msg *agentMessage) {
	if msg.ID == nil {
		switch {
		case msg.Err != nil:
			// Input the agent could not attribute: fail what is outstanding (SPEC 4).
			c.end(msg.Err)
			return
		case msg.Unknown:
			return // a newer agent's event
		case msg.Type == "restarting":
			c.mu.Lock()
			c.restarting = true
			c.mu.Unlock()
		case msg.Forcing != nil:
			c.extendForForcing(msg.Forcing.WaitMs)
		}
		c.mu.Lock()
		onEvent := c.onEvent
		c.mu.Unlock()
		if onEvent != nil {
			onEvent(msg)
		}
		return
	}
	switch {
	case msg.Err != nil:
		c.settle(*msg.ID, reply{err: msg.Err})
	case msg.Unknown:
		c.settle(*msg.ID, reply{err: protocolErr("unexpected reply type %s", msg.Type)})
	default:
		c.settle(*msg.ID, reply{msg: msg})
	}
}

func (c *connection) settle(id uint64, r reply) bool {
	c.mu.Lock()
	p, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if ok {
		p.done <- r
	}
	return ok
}

func (c *connection) extendForForcing(waitMs *uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.pending {
		if p.extend != nil {
			select {
			case p.extend <- waitMs:
			default:
			}
		}
	}
}

// setHandlers sets what events and the connection's end are handed to.
func (c *connection) setHandlers(onEvent func(*agentMessage), onEnd func(bool, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onEvent, c.onEnd = onEvent, onEnd
}

// request sends what build makes with a fresh id and waits for its reply,
// at most timeout (a forcing event extends that when canForce), or until
// ctx ends. The agent's error reply is returned as *Error.
func (c *connection) request(ctx context.Context, build func(id uint64) *Map, timeout time.Duration, canForce bool) (*agentMessage, error) {
	c.mu.Lock()
	if c.ended != nil {
		c.mu.Unlock()
		return nil, c.ended
	}
	id := c.nextID
	c.nextID++
	p := pending{done: make(chan reply, 1)}
	if canForce {
		p.extend = make(chan *uint64, 8)
	}
	c.pending[id] = p
	c.mu.Unlock()
	frame, err := EncodeFrame(build(id))
	if err == nil {
		c.writeMu.Lock()
		_, err = c.sock.Write(frame)
		c.writeMu.Unlock()
		if err != nil {
			err = unavailable("cannot send to the agent at %s: %v", c.path, err)
		}
	}
	if err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return nil, err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	expired := timer.C
	for {
		select {
		case r := <-p.done:
			return r.msg, r.err
		case waitMs := <-p.extend:
			// The agent waits for a displaced run to stop: so may we.
			timer.Stop()
			expired = nil
			if waitMs != nil {
				timer = time.NewTimer(time.Duration(*waitMs)*time.Millisecond + replySlack)
				expired = timer.C
			}
		case <-expired:
			c.abandon(id)
			return nil, unavailable("the agent at %s did not answer within %s", c.path, timeout)
		case <-ctx.Done():
			c.abandon(id)
			return nil, ctx.Err()
		}
	}
}

func (c *connection) abandon(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// close ends the connection; the agent then frees whatever it still holds.
func (c *connection) close() {
	c.end(unavailable("connection closed"))
}

func (c *connection) closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended != nil
}

func (c *connection) end(err error) {
	c.mu.Lock()
	if c.ended != nil {
		c.mu.Unlock()
		return
	}
	c.ended = err
	waiting := c.pending
	c.pending = map[uint64]pending{}
	onEnd, restarting := c.onEnd, c.restarting
	c.mu.Unlock()
	c.sock.Close()
	for _, p := range waiting {
		p.done <- reply{err: err}
	}
	if onEnd != nil {
		onEnd(restarting, err)
	}
}

func expect(msg *agentMessage, kind string) error {
	if msg.Type != kind {
		return fmt.Errorf("%w: expected %s, got %s", ErrProtocol, kind, msg.Type)
	}
	return nil
}
