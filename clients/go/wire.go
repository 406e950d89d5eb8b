package runlock

// Framing and body encoding (SPEC sections 2 and 3): a 4-byte big-endian
// length, then one MessagePack map. The only file that touches bytes.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// MaxBodyLen is the largest body either side may send (SPEC 2): 1 MiB.
const MaxBodyLen = 1 << 20

// maxDepth bounds nesting, as the agent does (SPEC 3.4).
const maxDepth = 16

// Map is a MessagePack map with string keys, in the order they came or are
// to be sent: the reference encoder's order reproduces the vectors byte for
// byte (SPEC 3.1).
type Map struct {
	keys   []string
	values map[string]interface{}
}

// NewMap starts a map; Set adds to it in order.
func NewMap() *Map { return &Map{values: map[string]interface{}{}} }

// Set adds key (or replaces its value, keeping its place) and returns the map.
func (m *Map) Set(key string, value interface{}) *Map {
	if _, there := m.values[key]; !there {
		m.keys = append(m.keys, key)
	}
	m.values[key] = value
	return m
}

// Get is the value of key, and whether it is there.
func (m *Map) Get(key string) (interface{}, bool) {
	v, ok := m.values[key]
	return v, ok
}

// Keys are the map's keys, in order.
func (m *Map) Keys() []string { return append([]string(nil), m.keys...) }

// A decoded value is one of: string, uint64, bool, nil, []interface{}, *Map.

// EncodeBody encodes one map: strings in the str family, integers in the
// smallest format (SPEC 3.2). Values must be string, bool, an unsigned
// integer, a slice of values or a *Map.
func EncodeBody(m *Map) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := encodeValue(enc, m, "message"); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func encodeValue(enc *msgpack.Encoder, value interface{}, where string) error {
	switch v := value.(type) {
	case string:
		return enc.EncodeString(v)
	case bool:
		return enc.EncodeBool(v)
	case uint64:
		return enc.EncodeUint(v)
	case uint32:
		return enc.EncodeUint(uint64(v))
	case uint16:
		return enc.EncodeUint(uint64(v))
	case []string:
		if err := enc.EncodeArrayLen(len(v)); err != nil {
			return err
		}
		for _, s := range v {
			if err := enc.EncodeString(s); err != nil {
				return err
			}
		}
		return nil
	case []interface{}:
		if err := enc.EncodeArrayLen(len(v)); err != nil {
			return err
		}
		for i, item := range v {
			if err := encodeValue(enc, item, fmt.Sprintf("%s[%d]", where, i)); err != nil {
				return err
			}
		}
		return nil
	case *Map:
		if err := enc.EncodeMapLen(len(v.keys)); err != nil {
			return err
		}
		for _, key := range v.keys {
			if err := enc.EncodeString(key); err != nil {
				return err
			}
			if err := encodeValue(enc, v.values[key], where+"."+key); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("runlock: %s: a %T cannot be sent (SPEC 3.2)", where, value)
}

// DecodeBody decodes one body strictly: exactly one map, string keys, no key
// twice, no bin, ext, float or negative integer, nothing after the map
// (SPEC 3.1, 3.2). Failures are ErrProtocol.
func DecodeBody(body []byte) (*Map, error) {
	reader := bytes.NewReader(body)
	dec := msgpack.NewDecoder(reader)
	value, err := decodeValue(dec, "message", 0)
	if err != nil {
		return nil, protocolErr("cannot decode message: %v", err)
	}
	if reader.Len() != 0 {
		return nil, protocolErr("cannot decode message: %d bytes after the map", reader.Len())
	}
	m, ok := value.(*Map)
	if !ok {
		return nil, protocolErr("cannot decode message: not a MessagePack map")
	}
	return m, nil
}

func decodeValue(dec *msgpack.Decoder, where string, depth int) (interface{}, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("%s: nested more than %d levels", where, maxDepth)
	}
	code, err := dec.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case code == msgpcode.Nil:
		return nil, dec.DecodeNil()
	case code == msgpcode.True || code == msgpcode.False:
		return dec.DecodeBool()
	case msgpcode.IsString(code):
		return dec.DecodeString()
	case code <= msgpcode.PosFixedNumHigh || (code >= msgpcode.Uint8 && code <= msgpcode.Uint64):
		return dec.DecodeUint64()
	case code >= msgpcode.NegFixedNumLow || (code >= msgpcode.Int8 && code <= msgpcode.Int64):
		n, err := dec.DecodeInt64()
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, fmt.Errorf("%s: %d is negative (integers are unsigned)", where, n)
		}
		return uint64(n), nil
	case msgpcode.IsFixedArray(code) || code == msgpcode.Array16 || code == msgpcode.Array32:
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		items := make([]interface{}, 0, minInt(n, 1024))
		for i := 0; i < n; i++ {
			item, err := decodeValue(dec, fmt.Sprintf("%s[%d]", where, i), depth+1)
			if err != nil {
				return nil, err
			}
			items = append(items, item)
		}
		return items, nil
	case msgpcode.IsFixedMap(code) || code == msgpcode.Map16 || code == msgpcode.Map32:
		n, err := dec.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		m := NewMap()
		for i := 0; i < n; i++ {
			keyCode, err := dec.PeekCode()
			if err != nil {
				return nil, err
			}
			if !msgpcode.IsString(keyCode) {
				return nil, fmt.Errorf("%s: a map key that is not a string", where)
			}
			key, err := dec.DecodeString()
			if err != nil {
				return nil, err
			}
			if _, twice := m.values[key]; twice {
				return nil, fmt.Errorf("%s: map key %q twice", where, key)
			}
			value, err := decodeValue(dec, where+"."+key, depth+1)
			if err != nil {
				return nil, err
			}
			m.Set(key, value)
		}
		return m, nil
	}
	return nil, fmt.Errorf("%s: format 0x%02x (bin, ext or float) is not used (SPEC 3.2)", where, code)
}

func minInt(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// EncodeFrame is the body with its length prefix; bodies over 1 MiB are refused.
func EncodeFrame(m *Map) ([]byte, error) {
	body, err := EncodeBody(m)
	if err != nil {
		return nil, err
	}
	if len(body) > MaxBodyLen {
		return nil, protocolErr("message of %d bytes is over the %d-byte limit", len(body), MaxBodyLen)
	}
	frame := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	copy(frame[4:], body)
	return frame, nil
}

// ReadFrame reads one frame's body; io.EOF when the stream ends cleanly
// between frames. The length is checked before any of the body is read or
// allocated (SPEC 2): an oversized frame is ErrProtocol, and the stream
// cannot be read on.
func ReadFrame(r io.Reader) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, protocolErr("connection closed in the middle of a frame")
		}
		return nil, err
	}
	length := binary.BigEndian.Uint32(head[:])
	if length > MaxBodyLen {
		return nil, protocolErr("agent sent a %d-byte frame, over the %d-byte limit", length, MaxBodyLen)
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil, protocolErr("connection closed in the middle of a frame")
		}
		return nil, err
	}
	return body, nil
}
