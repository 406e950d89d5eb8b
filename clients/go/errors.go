package runlock

import (
	"errors"
	"fmt"
)

// Sentinels for errors.Is. An agent error (*Error) matches the one of its
// code; a code this client does not know matches none of them and is still a
// failure (SPEC 9).
var (
	ErrHeld          = errors.New("runlock: key held")
	ErrTimeout       = errors.New("runlock: key still held after waiting") // also matches ErrHeld
	ErrUnavailable   = errors.New("runlock: unavailable")                  // no agent answered, or it or its backend is unavailable
	ErrInvalidKey    = errors.New("runlock: invalid key")
	ErrForbidden     = errors.New("runlock: forbidden")
	ErrNotOwner      = errors.New("runlock: not the owner")
	ErrUnsupported   = errors.New("runlock: unsupported")
	ErrBadRequest    = errors.New("runlock: bad request")
	ErrSlotsMismatch = errors.New("runlock: slots mismatch") // also matches ErrBadRequest
	ErrInternal      = errors.New("runlock: agent failed")
	ErrProtocol      = errors.New("runlock: protocol error") // the agent broke the protocol, or does not speak version 1
	ErrConfig        = errors.New("runlock: no socket path")
	ErrLockLost      = errors.New("runlock: lock lost")
)

var byCode = map[string][]error{
	"held":                {ErrHeld},
	"timeout":             {ErrTimeout, ErrHeld},
	"unavailable":         {ErrUnavailable},
	"invalid_key":         {ErrInvalidKey},
	"forbidden":           {ErrForbidden},
	"not_owner":           {ErrNotOwner},
	"unsupported":         {ErrUnsupported},
	"unsupported_version": {ErrProtocol},
	"bad_request":         {ErrBadRequest},
	"slots_mismatch":      {ErrSlotsMismatch, ErrBadRequest},
	"internal":            {ErrInternal},
}

// Error is the agent's `error` reply. Holder names who holds Key (held,
// timeout, slots_mismatch); for a key with slots Holders names each slot's
// holder and Holder is the first.
type Error struct {
	Code    string
	Message string
	Key     string
	Holder  *Holder
	Holders []Holder
}

func (e *Error) Error() string {
	if e.Key != "" {
		return fmt.Sprintf("runlock: %s (%s): %s", e.Code, e.Key, e.Message)
	}
	return fmt.Sprintf("runlock: %s: %s", e.Code, e.Message)
}

// Is matches the sentinel of the error's code.
func (e *Error) Is(target error) bool {
	for _, sentinel := range byCode[e.Code] {
		if sentinel == target {
			return true
		}
	}
	return false
}

// HeldWith is how many slots the live holders took the key with (1 for a
// plain key), for slots_mismatch; 0 when no holder is named.
func (e *Error) HeldWith() uint32 {
	first := e.Holder
	if len(e.Holders) > 0 {
		first = &e.Holders[0]
	}
	if first == nil {
		return 0
	}
	if first.Slots == nil {
		return 1
	}
	return *first.Slots
}

// LockLost says a lease ended while it was held: the work ran, or runs,
// unprotected. Events holds one LostEvent per lost lease. It matches ErrLockLost.
type LockLost struct {
	Events []LostEvent
	// Cause is what the protected work returned, from WithLock.
	Cause error
}

func (e *LockLost) Error() string {
	first := e.Events[0]
	return fmt.Sprintf("runlock: lock on %q lost (%s): %s", first.Key, first.Reason, first.Message)
}

// Is matches ErrLockLost.
func (e *LockLost) Is(target error) bool { return target == ErrLockLost }

// Unwrap is the work's error, from WithLock.
func (e *LockLost) Unwrap() error { return e.Cause }

func protocolErr(format string, args ...interface{}) error {
	return fmt.Errorf("%w: "+format, append([]interface{}{ErrProtocol}, args...)...)
}

func unavailable(format string, args ...interface{}) error {
	return fmt.Errorf("%w: "+format, append([]interface{}{ErrUnavailable}, args...)...)
}
