package runlock

// The protocol's messages (SPEC sections 6 and 7). Requests are built as
// maps in the reference encoder's field order, so they encode to the
// vectors' exact bytes; agent messages are read field by field into typed
// values. Unknown enum values are kept as the string they are (SPEC 3.3).

// ProtocolVersion is the version this client speaks.
const ProtocolVersion = 1

// Holder is who holds a lease (SPEC 7.1). Slot and Slots only for a key with slots.
type Holder struct {
	Host         string
	AgentID      string
	PID          uint32
	UID          uint32
	GID          uint32
	User         string
	Command      string
	AcquiredAtMs uint64
	Token        uint64
	Slot         *uint32
	Slots        *uint32
}

func readHolder(f *fields) Holder {
	return Holder{
		Host: f.str("host"), AgentID: f.str("agent_id"), PID: f.u32("pid"), UID: f.u32("uid"),
		GID: f.u32Or("gid", 0), User: f.str("user"), Command: f.str("command"),
		AcquiredAtMs: f.u64("acquired_at_ms"), Token: f.u64("token"), Slot: f.optU32("slot"), Slots: f.optU32("slots"),
	}
}

// Grant is one key granted by acquire (SPEC 7.2 Lease); Slot for a key with
// slots, whose Token is then that slot's own.
type Grant struct {
	Key     string
	LeaseID string
	Token   uint64
	Slot    *uint32
}

// KeyEvent is one entry of a key's history (SPEC 7.6).
type KeyEvent struct {
	Kind      string // granted, released, forced, broken, expired, lost, adopted (or newer)
	AtMs      uint64
	Clock     string // store or agent
	Token     uint64
	FromToken *uint64
	Host      string
	AgentID   string
	PID       uint32
	UID       uint32
	User      string
	Reason    string
	Slot      *uint32
}

func readEvent(f *fields) KeyEvent {
	reason, _ := f.optStr("reason", false)
	return KeyEvent{
		Kind: f.str("kind"), AtMs: f.u64("at_ms"), Clock: f.str("clock"), Token: f.u64("token"),
		FromToken: f.optU64("from_token"), Host: f.str("host"), AgentID: f.str("agent_id"),
		PID: f.u32("pid"), UID: f.u32("uid"), User: f.str("user"), Reason: reason, Slot: f.optU32("slot"),
	}
}

// KeyRecord is a key's record in the backend, as inspect reports it (SPEC
// 7.4). For a key with slots, Slots and Holders (one per held slot); State,
// Token, Holder and ExpiresInMs are then the lowest held slot's.
type KeyRecord struct {
	Key         string
	State       string // free or held (or newer)
	Token       uint64
	Holder      *Holder
	ExpiresInMs *uint64
	Scope       string // host or global
	Incident    *KeyEvent
	Slots       *uint32
	Holders     []Holder
}

func readRecord(f *fields) KeyRecord {
	return KeyRecord{
		Key: f.str("key"), State: f.str("state"), Token: f.u64("token"), Holder: objectOf(f, "holder", readHolder),
		ExpiresInMs: f.optU64("expires_in_ms"), Scope: f.str("scope"), Incident: objectOf(f, "incident", readEvent),
		Slots: f.optU32("slots"), Holders: arrayOf(f, "holders", false, readHolder),
	}
}

// LeaseInfo is one lease as Status reports it (SPEC 7.3); LeaseID is "" for
// another user's lease.
type LeaseInfo struct {
	Key      string
	LeaseID  string
	TTLMs    uint64
	Holder   Holder
	ChildPID *uint32
}

// Refusal is an acquire an agent refused because its key was held (SPEC 7.8).
type Refusal struct {
	AtMs     uint64
	Host     string
	UID      uint32
	User     string
	PID      uint32
	WaitedMs uint64
}

// Waiter is an acquire waiting for a key, through any agent (SPEC 7.8).
type Waiter struct {
	Host    string
	UID     uint32
	User    string
	PID     uint32
	SinceMs uint64
}

// KeyListing is one key of a ListKeys page (SPEC 7.7): its record, or why
// it could not be read.
type KeyListing struct {
	Key           string
	Record        *KeyRecord
	Unreadable    string
	Events        []KeyEvent
	EventsOmitted uint32
	WaitingHere   uint32
	Waiters       []Waiter
	Refused       []Refusal
}

func readListing(f *fields) KeyListing {
	unreadable, _ := f.optStr("unreadable", false)
	return KeyListing{
		Key: f.str("key"), Record: objectOf(f, "record", readRecord), Unreadable: unreadable,
		Events: arrayOf(f, "events", false, readEvent), EventsOmitted: f.u32Or("events_omitted", 0),
		WaitingHere: f.u32Or("waiting_here", 0), Waiters: arrayOf(f, "waiters", false, readWaiter),
		Refused: arrayOf(f, "refused", false, readRefusal),
	}
}

func readWaiter(f *fields) Waiter {
	return Waiter{Host: f.str("host"), UID: f.u32("uid"), User: f.str("user"), PID: f.u32("pid"), SinceMs: f.u64("since_ms")}
}

func readRefusal(f *fields) Refusal {
	host, _ := f.optStr("host", false)
	waited, _ := f.uint("waited_ms", maxU64, false)
	return Refusal{AtMs: f.u64("at_ms"), Host: host, UID: f.u32("uid"), User: f.str("user"), PID: f.u32("pid"), WaitedMs: waited}
}

func readGrant(f *fields) Grant {
	return Grant{Key: f.str("key"), LeaseID: f.str("lease_id"), Token: f.u64("token"), Slot: f.optU32("slot")}
}

func readLeaseInfo(f *fields) LeaseInfo {
	info := LeaseInfo{Key: f.str("key"), LeaseID: f.str("lease_id"), TTLMs: f.u64("ttl_ms"), ChildPID: f.optU32("child_pid")}
	if holder := objectOf(f, "holder", readHolder); holder != nil {
		info.Holder = *holder
	} else {
		f.fail("missing field holder")
	}
	return info
}

// Welcome is the agent's answer to hello (SPEC 6.2).
type Welcome struct {
	Version            uint16
	Agent              string
	AgentID            string
	Backend            string
	Scope              string
	DefaultTTLMs       uint64
	OnUnavailable      string // fail, warn or skip
	LeasesSurviveAgent bool
}

// LostEvent says a lease ended while held: the agent's lost event (forced,
// broken, expired), or this client's own "restarting" and "agent_gone" (the
// agent said it is going away, or the connection ended). Holder is the new
// holder after forced.
type LostEvent struct {
	LeaseID string
	Key     string
	Reason  string
	Message string
	Holder  *Holder
}

// Forcing says a forced acquire (or a break) has taken Key and waits, at most
// WaitMs (nil: no deadline, on file://), for the run it took it from to stop.
type Forcing struct {
	Key    string
	Holder *Holder
	WaitMs *uint64
}

// Renewed says a lease stays guaranteed for ValidForMs from now.
type Renewed struct {
	LeaseID    string
	ValidForMs uint64
}

// agentMessage is any agent message: Type, ID, and the part its type fills.
type agentMessage struct {
	Type string
	ID   *uint64

	Welcome  *Welcome
	Grants   []Grant // acquired
	TTLMs    uint64  // acquired
	ValidFor *uint64 // acquired
	Locks    uint32  // acquired
	Count    uint32  // released
	Leases   []LeaseInfo
	Omitted  uint32
	Record   *KeyRecord
	Key      string // events
	Events   []KeyEvent
	Keys     []KeyListing
	Cursor   *string
	Err      *Error
	Lost     *LostEvent
	Forcing  *Forcing
	Renewed  *Renewed
	Unknown  bool
}

// messageID is the body's id when readable, even if the rest is not (SPEC 3.4).
func messageID(m *Map) *uint64 {
	if v, ok := m.Get("id"); ok {
		if id, isUint := v.(uint64); isUint {
			return &id
		}
	}
	return nil
}

// parseAgent reads a decoded agent body into a typed message; ErrProtocol
// when a field is missing or of the wrong type.
func parseAgent(m *Map) (*agentMessage, error) {
	f := &fields{m: m, where: "message"}
	msg := &agentMessage{Type: f.str("type"), ID: f.optU64("id")}
	if f.err != nil {
		return nil, f.err
	}
	f.where = msg.Type
	switch msg.Type {
	case "welcome":
		version, _ := f.uint("version", maxU16, true)
		onUnavailable, present := f.optStr("on_unavailable", false)
		if !present {
			onUnavailable = "fail"
		}
		msg.Welcome = &Welcome{
			Version: uint16(version), Agent: f.str("agent"), AgentID: f.str("agent_id"), Backend: f.str("backend"),
			Scope: f.str("scope"), DefaultTTLMs: f.u64("default_ttl_ms"), OnUnavailable: onUnavailable,
			LeasesSurviveAgent: f.boolOr("leases_survive_agent", false),
		}
	case "acquired":
		msg.Grants = arrayOf(f, "leases", true, readGrant)
		msg.TTLMs, msg.ValidFor, msg.Locks = f.u64("ttl_ms"), f.optU64("valid_for_ms"), f.u32Or("locks", 0)
	case "released":
		msg.Count = f.u32("count")
	case "leases":
		msg.Leases = arrayOf(f, "leases", true, readLeaseInfo)
		msg.Omitted = f.u32Or("omitted", 0)
	case "record":
		record := readRecord(f)
		msg.Record = &record
	case "events":
		msg.Key, msg.Events = f.str("key"), arrayOf(f, "events", true, readEvent)
	case "keys":
		msg.Keys = arrayOf(f, "keys", true, readListing)
		if cursor, ok := f.optStr("cursor", false); ok {
			msg.Cursor = &cursor
		}
	case "error":
		key, _ := f.optStr("key", false)
		msg.Err = &Error{Code: f.str("code"), Message: f.str("message"), Key: key, Holder: objectOf(f, "holder", readHolder), Holders: arrayOf(f, "holders", false, readHolder)}
	case "lost":
		msg.Lost = &LostEvent{LeaseID: f.str("lease_id"), Key: f.str("key"), Reason: f.str("reason"), Message: f.str("message"), Holder: objectOf(f, "holder", readHolder)}
	case "forcing":
		msg.Forcing = &Forcing{Key: f.str("key"), Holder: objectOf(f, "holder", readHolder), WaitMs: f.optU64("wait_ms")}
	case "renewed":
		msg.Renewed = &Renewed{LeaseID: f.str("lease_id"), ValidForMs: f.u64("valid_for_ms")}
	case "attached", "pong", "restarting":
	default:
		msg.Unknown = true
	}
	if f.err != nil {
		return nil, f.err
	}
	return msg, nil
}

// ---------------------------------------------------------------- requests

func request(id uint64, kind string) *Map {
	return NewMap().Set("id", id).Set("type", kind)
}

func helloRequest(client string, pid uint32, takesLocks bool) *Map {
	m := NewMap().Set("type", "hello").Set("version", uint16(ProtocolVersion)).Set("client", client).Set("pid", pid)
	if takesLocks {
		m.Set("takes_locks", true)
	}
	return m
}

// acquireFields are acquire's optional fields; nil or zero ones are left out,
// except command and on_lost, which the reference encoder always writes.
type acquireFields struct {
	TTLMs   *uint64
	WaitMs  *uint64
	Force   *bool
	Command string
	OnLost  string
	Slots   uint32
}

func acquireRequest(id uint64, keys []string, a acquireFields) *Map {
	m := request(id, "acquire").Set("keys", append([]string(nil), keys...))
	if a.TTLMs != nil {
		m.Set("ttl_ms", *a.TTLMs)
	}
	if a.WaitMs != nil {
		m.Set("wait_ms", *a.WaitMs)
	}
	if a.Force != nil {
		m.Set("force", *a.Force)
	}
	onLost := a.OnLost
	if onLost == "" {
		onLost = "term"
	}
	m.Set("command", a.Command).Set("on_lost", onLost)
	if a.Slots > 1 {
		m.Set("slots", a.Slots)
	}
	return m
}

func releaseRequest(id uint64, leaseIDs []string) *Map {
	return request(id, "release").Set("lease_ids", append([]string(nil), leaseIDs...))
}

func breakRequest(id uint64, key string, slot *uint32) *Map {
	m := request(id, "release").Set("key", key)
	if slot != nil {
		m.Set("slot", *slot)
	}
	return m
}

func attachRequest(id uint64, pid, pgid uint32) *Map {
	return request(id, "attach").Set("pid", pid).Set("pgid", pgid)
}

func reattachRequest(id uint64, grants []Grant, onLost string) *Map {
	leases := make([]interface{}, 0, len(grants))
	for _, g := range grants {
		lease := NewMap().Set("key", g.Key).Set("lease_id", g.LeaseID).Set("token", g.Token)
		if g.Slot != nil {
			lease.Set("slot", *g.Slot)
		}
		leases = append(leases, lease)
	}
	return request(id, "reattach").Set("leases", leases).Set("on_lost", onLost)
}

func inspectRequest(id uint64, key string) *Map { return request(id, "inspect").Set("key", key) }

func historyRequest(id uint64, key string, limit uint32) *Map {
	m := request(id, "history").Set("key", key)
	if limit > 0 {
		m.Set("limit", limit)
	}
	return m
}

type listKeysFields struct {
	Prefix        string
	Cursor        *string
	Free          bool
	EventsSinceMs *uint64
}

func listKeysRequest(id uint64, l listKeysFields) *Map {
	m := request(id, "list_keys")
	if l.Prefix != "" {
		m.Set("prefix", l.Prefix)
	}
	if l.Cursor != nil {
		m.Set("cursor", *l.Cursor)
	}
	if l.Free {
		m.Set("free", true)
	}
	if l.EventsSinceMs != nil {
		m.Set("events_since_ms", *l.EventsSinceMs)
	}
	return m
}
