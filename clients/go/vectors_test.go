package runlock

// The protocol's golden vectors (protocol/vectors/): every body decodes to
// the JSON its README gives, canonical ones re-encode byte for byte, every
// request this package builds matches its vector, and the framing matches
// frame-ping.bin.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

func vectorsDir(t *testing.T) string {
	dir := filepath.Join(repoRoot(t), "protocol", "vectors")
	if _, err := os.Stat(filepath.Join(dir, "README.md")); err != nil {
		t.Fatalf("no vectors at %s: %v", dir, err)
	}
	return dir
}

var (
	sectionName = regexp.MustCompile("^`([^`]+)`")
	sectionJSON = regexp.MustCompile("(?s)```json\n(.*?)\n```")
)

// readmeValues maps each vector's file name to the JSON its README section gives.
func readmeValues(t *testing.T) map[string]interface{} {
	text, err := os.ReadFile(filepath.Join(vectorsDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]interface{}{}
	for _, section := range strings.Split(string(text), "\n### ")[1:] {
		name, block := sectionName.FindStringSubmatch(section), sectionJSON.FindStringSubmatch(section)
		if name == nil || block == nil {
			t.Fatalf("a README section without a name or JSON: %.60s", section)
		}
		dec := json.NewDecoder(strings.NewReader(block[1]))
		dec.UseNumber()
		var value interface{}
		if err := dec.Decode(&value); err != nil {
			t.Fatalf("%s: %v", name[1], err)
		}
		values[name[1]] = value
	}
	return values
}

// asJSON is a decoded value in the shapes encoding/json gives, to compare.
func asJSON(value interface{}) interface{} {
	switch v := value.(type) {
	case *Map:
		m := map[string]interface{}{}
		for _, key := range v.keys {
			m[key] = asJSON(v.values[key])
		}
		return m
	case []interface{}:
		items := make([]interface{}, len(v))
		for i, item := range v {
			items[i] = asJSON(item)
		}
		return items
	case uint64:
		return json.Number(fmt.Sprint(v))
	}
	return value
}

func vectorNames(t *testing.T, sub string) []string {
	found, err := filepath.Glob(filepath.Join(vectorsDir(t), sub, "*.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(found))
	for i, path := range found {
		names[i] = filepath.ToSlash(filepath.Join(sub, filepath.Base(path)))
	}
	sort.Strings(names)
	return names
}

func vector(t *testing.T, name string) []byte {
	raw, err := os.ReadFile(filepath.Join(vectorsDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func parsed(t *testing.T, name string) *agentMessage {
	t.Helper()
	m, err := DecodeBody(vector(t, name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	msg, err := parseAgent(m)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return msg
}

func TestEveryVectorDecodesToItsReadmeValue(t *testing.T) {
	values := readmeValues(t)
	canonical, decodeOnly := vectorNames(t, ""), vectorNames(t, "decode-only")
	if len(canonical) < 30 || len(decodeOnly) == 0 {
		t.Fatalf("too few vectors: %d and %d", len(canonical), len(decodeOnly))
	}
	for _, name := range append(append([]string{"frame-ping.bin"}, canonical...), decodeOnly...) {
		if _, ok := values[name]; !ok {
			t.Errorf("%s is missing from the vectors README", name)
		}
	}
	for _, name := range append(canonical, decodeOnly...) {
		m, err := DecodeBody(vector(t, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got := asJSON(m); !reflect.DeepEqual(got, values[name]) {
			t.Errorf("%s: decoded %v, README says %v", name, got, values[name])
		}
	}
}

func TestCanonicalVectorsReencodeByteForByte(t *testing.T) {
	for _, name := range vectorNames(t, "") {
		raw := vector(t, name)
		m, err := DecodeBody(raw)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		again, err := EncodeBody(m)
		if err != nil || !bytes.Equal(again, raw) {
			t.Errorf("%s: re-encoded as % x (%v), not % x", name, again, err, raw)
		}
	}
}

func u32(n uint32) *uint32 { return &n }
func u64(n uint64) *uint64 { return &n }

// Built with the request builders, so that their field order is what is checked.
var built = map[string]func() *Map{
	"client-hello.msgpack":             func() *Map { return helloRequest("runlock 0.1.0", 4242, false) },
	"client-hello-takes-locks.msgpack": func() *Map { return helloRequest("runlock 0.1.0", 4242, true) },
	"client-acquire-minimal.msgpack":   func() *Map { return acquireRequest(1, []string{"dev:tap-x-to-target-y"}, acquireFields{}) },
	"client-acquire-full.msgpack": func() *Map {
		force := true
		return acquireRequest(2, []string{"dev:b", "dev:a"}, acquireFields{
			TTLMs: u64(30000), WaitMs: u64(60000), Force: &force, Command: "meltano run tap-x target-y", OnLost: "kill",
		})
	},
	"client-acquire-slots.msgpack": func() *Map {
		return acquireRequest(11, []string{"warehouse"}, acquireFields{WaitMs: u64(60000), Command: "meltano run tap-x target-y", Slots: 3})
	},
	"client-release-lease-ids.msgpack": func() *Map { return releaseRequest(3, []string{"lease-0001", "lease-0002"}) },
	"client-release-key.msgpack":       func() *Map { return breakRequest(4, "dev:a", nil) },
	"client-release-key-slot.msgpack":  func() *Map { return breakRequest(12, "warehouse", u32(2)) },
	"client-attach.msgpack":            func() *Map { return attachRequest(5, 4300, 4300) },
	"client-reattach.msgpack": func() *Map {
		return reattachRequest(9, []Grant{{Key: "dev:a", LeaseID: "lease-0001", Token: 12}}, "term")
	},
	"client-list.msgpack":    func() *Map { return request(6, "list") },
	"client-inspect.msgpack": func() *Map { return inspectRequest(7, "dev:a") },
	"client-ping.msgpack":    func() *Map { return request(8, "ping") },
	"client-history.msgpack": func() *Map { return historyRequest(10, "dev:a", 3) },
	"client-list_keys.msgpack": func() *Map {
		cursor := `{"page":"token-2"}`
		return listKeysRequest(11, listKeysFields{Prefix: "dev:", Cursor: &cursor, Free: true, EventsSinceMs: u64(1700000000000)})
	},
}

func TestEveryClientVectorIsBuiltByteForByte(t *testing.T) {
	var clientVectors []string
	for _, name := range vectorNames(t, "") {
		if strings.HasPrefix(name, "client-") {
			clientVectors = append(clientVectors, name)
			if built[name] == nil {
				t.Errorf("no builder for %s", name)
			}
		}
	}
	if len(clientVectors) != len(built) {
		t.Errorf("%d builders for %d client vectors", len(built), len(clientVectors))
	}
	for name, build := range built {
		body, err := EncodeBody(build())
		if err != nil || !bytes.Equal(body, vector(t, name)) {
			t.Errorf("%s: built % x (%v), want % x", name, body, err, vector(t, name))
		}
	}
}

func TestEveryAgentVectorParsesIntoATypedMessage(t *testing.T) {
	values := readmeValues(t)
	for _, name := range append(vectorNames(t, ""), vectorNames(t, "decode-only")...) {
		if !strings.HasPrefix(filepath.Base(name), "agent-") {
			continue
		}
		msg := parsed(t, name)
		value := values[name].(map[string]interface{})
		if id, has := value["id"]; has != (msg.ID != nil) || (has && id.(json.Number).String() != fmt.Sprint(*msg.ID)) {
			t.Errorf("%s: id %v, README %v", name, msg.ID, id)
		}
		if msg.Unknown != (value["type"] == "moved") {
			t.Errorf("%s: type %s read as unknown=%v", name, msg.Type, msg.Unknown)
		}
	}
}

var holder = Holder{
	Host: "runner-01", AgentID: "5b0e7c1a-3f4d-4e8a-9c2b-7d1e6f0a4b3c", PID: 4242, UID: 1000, GID: 1000,
	User: "etl", Command: "meltano run tap-x target-y", AcquiredAtMs: 1700000000000, Token: 41,
}

func TestErrorsMatchTheirSentinels(t *testing.T) {
	held := parsed(t, "agent-error-held.msgpack").Err
	if !errors.Is(held, ErrHeld) || errors.Is(held, ErrTimeout) || held.Key != "dev:tap-x-to-target-y" {
		t.Errorf("held: %v", held)
	}
	if !reflect.DeepEqual(*held.Holder, holder) || len(held.Holders) != 0 {
		t.Errorf("held's holder: %+v %+v", held.Holder, held.Holders)
	}
	timeout := parsed(t, "agent-error-timeout.msgpack").Err
	if !errors.Is(timeout, ErrTimeout) || !errors.Is(timeout, ErrHeld) || timeout.Holder.Token != 12 {
		t.Errorf("timeout: %v", timeout)
	}
	invalid := parsed(t, "agent-error-invalid-key.msgpack").Err
	if !errors.Is(invalid, ErrInvalidKey) || invalid.Key != "dev\nx" {
		t.Errorf("invalid key: %v", invalid)
	}
	unknown := parsed(t, "decode-only/agent-error-unknown-code.msgpack").Err
	for _, sentinel := range []error{ErrHeld, ErrUnavailable, ErrBadRequest, ErrInternal} {
		if errors.Is(unknown, sentinel) {
			t.Errorf("an unknown code matches %v", sentinel)
		}
	}
	if unknown.Code != "quota_exceeded" || unknown.Message != "too many" {
		t.Errorf("unknown code: %+v", unknown)
	}
}

func TestRepliesAndEvents(t *testing.T) {
	welcome := parsed(t, "agent-welcome.msgpack").Welcome
	if !welcome.LeasesSurviveAgent || welcome.DefaultTTLMs != 60000 {
		t.Errorf("welcome: %+v", welcome)
	}
	acquired := parsed(t, "agent-acquired.msgpack")
	want := []Grant{{Key: "dev:a", LeaseID: "lease-0001", Token: 12}, {Key: "dev:b", LeaseID: "lease-0002", Token: 3}}
	if !reflect.DeepEqual(acquired.Grants, want) || *acquired.ValidFor != 25000 || acquired.Locks != 0 {
		t.Errorf("acquired: %+v", acquired)
	}
	if locks := parsed(t, "agent-acquired-locks.msgpack").Locks; locks != 1 {
		t.Errorf("locks: %d", locks)
	}
	free := parsed(t, "agent-record-free.msgpack").Record
	if !reflect.DeepEqual(*free, KeyRecord{Key: "dev:a", State: "free", Token: 12, Scope: "global"}) {
		t.Errorf("free record: %+v", free)
	}
	held := parsed(t, "agent-record-held-file.msgpack").Record
	if held.Holder == nil || held.ExpiresInMs != nil || held.Scope != "host" {
		t.Errorf("held record: %+v", held)
	}
	leases := parsed(t, "agent-leases.msgpack").Leases
	if len(leases) != 2 || *leases[0].ChildPID != 4300 || leases[1].ChildPID != nil {
		t.Errorf("leases: %+v", leases)
	}
	lost := parsed(t, "agent-lost-forced.msgpack").Lost
	if lost.Reason != "forced" || lost.Holder.Token != 13 {
		t.Errorf("lost: %+v", lost)
	}
	if expired := parsed(t, "agent-lost-expired.msgpack").Lost; expired.Holder != nil {
		t.Errorf("expired: %+v", expired)
	}
	forcing := parsed(t, "agent-forcing.msgpack").Forcing
	if *forcing.WaitMs != 33000 || forcing.Holder.Token != 12 {
		t.Errorf("forcing: %+v", forcing)
	}
	if unbounded := parsed(t, "agent-forcing-no-deadline.msgpack").Forcing; unbounded.WaitMs != nil {
		t.Errorf("forcing without deadline: %+v", unbounded)
	}
	if renewed := parsed(t, "agent-renewed.msgpack").Renewed; *renewed != (Renewed{LeaseID: "lease-0001", ValidForMs: 25000}) {
		t.Errorf("renewed: %+v", renewed)
	}
	if pong := parsed(t, "decode-only/agent-pong-unknown-fields.msgpack"); pong.Type != "pong" || *pong.ID != 8 {
		t.Errorf("pong: %+v", pong)
	}
}

func TestHistoryListingAndSlots(t *testing.T) {
	events := parsed(t, "agent-events.msgpack").Events
	if len(events) != 3 || events[1].Kind != "forced" || *events[1].FromToken != 12 || events[0].FromToken != nil || events[2].Reason != "its run ended" {
		t.Errorf("events: %+v", events)
	}
	if incident := parsed(t, "agent-record-held-incident.msgpack").Record.Incident; !reflect.DeepEqual(*incident, events[1]) {
		t.Errorf("incident: %+v", incident)
	}
	cut := parsed(t, "agent-keys-events-omitted.msgpack")
	if cut.Cursor != nil || cut.Keys[0].EventsOmitted != 2047 || len(cut.Keys[0].Events) != 1 {
		t.Errorf("keys: %+v", cut)
	}
	if slot := parsed(t, "agent-acquired-slot.msgpack").Grants[0]; *slot.Slot != 1 || slot.Token != 5 {
		t.Errorf("slot grant: %+v", slot)
	}
	record := parsed(t, "agent-record-slots.msgpack").Record
	if *record.Slots != 3 || len(record.Holders) != 2 || *record.Holders[1].Slot != 2 {
		t.Errorf("slots record: %+v", record)
	}
	mismatch := parsed(t, "agent-error-slots-mismatch.msgpack").Err
	if !errors.Is(mismatch, ErrSlotsMismatch) || !errors.Is(mismatch, ErrBadRequest) || errors.Is(mismatch, ErrHeld) || mismatch.HeldWith() != 5 {
		t.Errorf("slots mismatch: %+v", mismatch)
	}
}

func TestFramePing(t *testing.T) {
	raw := vector(t, "frame-ping.bin")
	frame, err := EncodeFrame(request(1, "ping"))
	if err != nil || !bytes.Equal(frame, raw) {
		t.Errorf("framed % x (%v), want % x", frame, err, raw)
	}
	reader := bytes.NewReader(raw)
	body, err := ReadFrame(reader)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := DecodeBody(body); err != nil || !reflect.DeepEqual(asJSON(m), readmeValues(t)["frame-ping.bin"]) {
		t.Errorf("decoded %v (%v)", m, err)
	}
	if _, err := ReadFrame(reader); err == nil || errors.Is(err, ErrProtocol) {
		t.Errorf("a clean end between frames: %v", err)
	}
}

func TestOversizedAndTruncatedFrames(t *testing.T) {
	if _, err := EncodeFrame(NewMap().Set("type", "inspect").Set("key", strings.Repeat("x", MaxBodyLen))); !errors.Is(err, ErrProtocol) {
		t.Errorf("an oversized body was framed: %v", err)
	}
	var head [4]byte
	binary.BigEndian.PutUint32(head[:], MaxBodyLen+1)
	if _, err := ReadFrame(bytes.NewReader(head[:])); !errors.Is(err, ErrProtocol) {
		t.Errorf("an oversized frame was read: %v", err)
	}
	if _, err := ReadFrame(bytes.NewReader([]byte{0, 0, 0, 10, 0x82})); !errors.Is(err, ErrProtocol) {
		t.Errorf("a truncated frame was read: %v", err)
	}
}

func TestUndecodableBodies(t *testing.T) {
	for what, body := range map[string][]byte{
		"not a map":           {0x92, 0x01, 0x02},
		"a key twice":         append(append([]byte{0x82}, pair("type", "pong")...), pair("type", "pong")...),
		"a non-string key":    {0x81, 0x01, 0x02},
		"bytes after the map": append(append([]byte{0x81}, pair("type", "pong")...), 0x00),
		"a bin value":         {0x81, 0xa1, 'x', 0xc4, 0x01, 0x70},
		"a float value":       {0x81, 0xa1, 'x', 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0},
		"a negative value":    {0x81, 0xa1, 'x', 0xff},
		"nested too deep":     append(bytes.Repeat([]byte{0x81, 0xa1, 'x'}, 20), 0x01),
	} {
		if _, err := DecodeBody(body); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v", what, err)
		}
	}
}

func pair(key, value string) []byte {
	return append(append([]byte{0xa0 + byte(len(key))}, key...), append([]byte{0xa0 + byte(len(value))}, value...)...)
}

func TestBadFieldsAreProtocolErrors(t *testing.T) {
	lease := NewMap().Set("key", "k").Set("lease_id", "l").Set("token", uint64(1)).Set("slot", uint64(1)<<32)
	for what, m := range map[string]*Map{
		"a required field missing": NewMap().Set("type", "released"),
		"a bool for an integer":    NewMap().Set("type", "released").Set("count", true),
		"over uint32":              NewMap().Set("type", "released").Set("count", uint64(1)<<32),
		"a number for a string":    NewMap().Set("type", "renewed").Set("lease_id", uint64(3)).Set("valid_for_ms", uint64(1)),
		"a slot over uint32":       NewMap().Set("type", "acquired").Set("ttl_ms", uint64(1)).Set("leases", []interface{}{lease}),
		"holders as a map":         NewMap().Set("type", "record").Set("key", "k").Set("state", "free").Set("token", uint64(0)).Set("scope", "host").Set("holders", NewMap()),
		"a holder that is no map":  NewMap().Set("type", "error").Set("code", "held").Set("message", "m").Set("holders", []interface{}{uint64(1)}),
	} {
		if _, err := parseAgent(m); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v", what, err)
		}
	}
}
