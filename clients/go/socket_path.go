package runlock

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// SystemSocket is root's agent socket.
const SystemSocket = "/run/runlock/agent.sock"

const systemConfig = "/etc/runlock/runlockd.toml"

var socketSetting = regexp.MustCompile(`^\s*socket\s*=\s*"([^"\\]+)"\s*(#.*)?$`)

// configuredSocket is the agent configuration's top-level `socket`, when it is
// a plain basic string; a file that is missing or unreadable is skipped.
func configuredSocket() string {
	path := os.Getenv("RUNLOCK_CONFIG")
	if path == "" {
		path = systemConfig
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "[") {
			return "" // tables begin: no top-level key after this
		}
		if found := socketSetting.FindStringSubmatch(line); found != nil {
			return found[1]
		}
	}
	return ""
}

// ResolveSocket is the socket rule (SPEC 1): explicit, else RUNLOCK_SOCKET,
// else the agent configuration's `socket`, else root's or
// $XDG_RUNTIME_DIR's; ErrConfig when none applies.
func ResolveSocket(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if found := os.Getenv("RUNLOCK_SOCKET"); found != "" {
		return found, nil
	}
	if found := configuredSocket(); found != "" {
		return found, nil
	}
	if os.Geteuid() == 0 {
		return SystemSocket, nil
	}
	if runtime := os.Getenv("XDG_RUNTIME_DIR"); runtime != "" {
		return filepath.Join(runtime, "runlock", "agent.sock"), nil
	}
	return "", fmt.Errorf("%w: give Client.Socket, set RUNLOCK_SOCKET or XDG_RUNTIME_DIR, or run as root", ErrConfig)
}
