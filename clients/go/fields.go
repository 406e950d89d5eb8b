package runlock

import "fmt"

// fields reads an agent body's fields, checking each one's wire type and
// range: the first missing required field or wrong type is kept in err, and
// every later read returns a zero value. Unknown fields are never looked at
// (SPEC 3.3).
type fields struct {
	m     *Map
	where string
	err   error
}

const (
	maxU16 = 1<<16 - 1
	maxU32 = 1<<32 - 1
	maxU64 = 1<<64 - 1
)

func (f *fields) fail(format string, args ...interface{}) {
	if f.err == nil {
		f.err = protocolErr("%s: %s", f.where, fmt.Sprintf(format, args...))
	}
}

func (f *fields) get(name string, required bool) (interface{}, bool) {
	if f.err != nil {
		return nil, false
	}
	value, ok := f.m.Get(name)
	if !ok && required {
		f.fail("missing field %s", name)
	}
	return value, ok
}

func (f *fields) str(name string) string {
	s, _ := f.optStr(name, true)
	return s
}

func (f *fields) optStr(name string, required bool) (string, bool) {
	value, ok := f.get(name, required)
	if !ok {
		return "", false
	}
	s, isStr := value.(string)
	if !isStr {
		f.fail("field %s: %v is not a string", name, value)
	}
	return s, isStr
}

func (f *fields) uint(name string, limit uint64, required bool) (uint64, bool) {
	value, ok := f.get(name, required)
	if !ok {
		return 0, false
	}
	n, isUint := value.(uint64)
	if !isUint || n > limit {
		f.fail("field %s: %v is not an unsigned integer up to %d", name, value, limit)
		return 0, false
	}
	return n, true
}

func (f *fields) u64(name string) uint64 {
	n, _ := f.uint(name, maxU64, true)
	return n
}

func (f *fields) u32(name string) uint32 {
	n, _ := f.uint(name, maxU32, true)
	return uint32(n)
}

// u32Or is an optional uint32 with a default.
func (f *fields) u32Or(name string, absent uint32) uint32 {
	if n, ok := f.uint(name, maxU32, false); ok {
		return uint32(n)
	}
	return absent
}

func (f *fields) optU32(name string) *uint32 {
	if n, ok := f.uint(name, maxU32, false); ok {
		v := uint32(n)
		return &v
	}
	return nil
}

func (f *fields) optU64(name string) *uint64 {
	if n, ok := f.uint(name, maxU64, false); ok {
		return &n
	}
	return nil
}

func (f *fields) boolOr(name string, absent bool) bool {
	value, ok := f.get(name, false)
	if !ok {
		return absent
	}
	b, isBool := value.(bool)
	if !isBool {
		f.fail("field %s: %v is not a boolean", name, value)
	}
	return b
}

// object reads a nested map with read, when present.
func (f *fields) object(name string, required bool, read func(*fields)) bool {
	value, ok := f.get(name, required)
	if !ok {
		return false
	}
	return f.nested(name, value, read)
}

func (f *fields) nested(where string, value interface{}, read func(*fields)) bool {
	m, isMap := value.(*Map)
	if !isMap {
		f.fail("%s: not a map", where)
		return false
	}
	inner := fields{m: m, where: f.where + "." + where}
	read(&inner)
	if inner.err != nil && f.err == nil {
		f.err = inner.err
	}
	return inner.err == nil
}

// array reads each map of an array with read.
func (f *fields) array(name string, required bool, read func(*fields)) {
	value, ok := f.get(name, required)
	if !ok {
		return
	}
	items, isArray := value.([]interface{})
	if !isArray {
		f.fail("field %s: not an array", name)
		return
	}
	for i, item := range items {
		if !f.nested(fmt.Sprintf("%s[%d]", name, i), item, read) {
			return
		}
	}
}

// objectOf reads the nested map name with read; nil when it is absent.
func objectOf[T any](f *fields, name string, read func(*fields) T) *T {
	var got T
	if f.object(name, false, func(inner *fields) { got = read(inner) }) {
		return &got
	}
	return nil
}

// arrayOf reads each map of the array name with read.
func arrayOf[T any](f *fields, name string, required bool, read func(*fields) T) []T {
	var all []T
	f.array(name, required, func(inner *fields) { all = append(all, read(inner)) })
	return all
}
