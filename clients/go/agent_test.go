package runlock

// A real runlockd for tests, on a socket of its own, with an empty
// configuration and none of the caller's RUNLOCK_* settings (as
// clients/python's runlock.testing does).

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// agentStartTimeout bounds every start-up and shutdown of an agent.
const agentStartTimeout = 20 * time.Second

// repoRoot is the repository: this package is its clients/go.
func repoRoot(t testing.TB) string {
	here, err := os.Getwd()
	if err == nil {
		here, err = filepath.EvalSymlinks(here) // a GOPATH of links, as run-tests.sh makes
	}
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(filepath.Dir(here))
}

var (
	buildOnce  sync.Once
	builtAgent string
	buildErr   error
)

// runlockd is $RUNLOCKD, else the workspace's debug runlockd, built once.
func runlockd(t testing.TB) string {
	if given := os.Getenv("RUNLOCKD"); given != "" {
		return given
	}
	buildOnce.Do(func() {
		root := repoRoot(t)
		build := exec.Command("cargo", "build", "-q", "-p", "runlock-agent", "--bin", "runlockd")
		build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
		if buildErr = build.Run(); buildErr != nil {
			return
		}
		meta := exec.Command("cargo", "metadata", "--format-version", "1", "--no-deps")
		meta.Dir = root
		out, err := meta.Output()
		if err != nil {
			buildErr = err
			return
		}
		var m struct {
			TargetDirectory string `json:"target_directory"`
		}
		buildErr = json.Unmarshal(out, &m)
		builtAgent = filepath.Join(m.TargetDirectory, "debug", "runlockd")
	})
	if buildErr != nil {
		t.Fatalf("building runlockd (or set RUNLOCKD): %v", buildErr)
	}
	return builtAgent
}

type testAgent struct {
	socket string
	dir    string
	proc   *exec.Cmd
	exited chan struct{}
}

// startAgent runs a runlockd on backend ("memory", "file", or a URI whose
// environment env gives) in a fresh directory under /tmp (a socket path must
// stay under ~108 bytes); the test's cleanup stops it.
func startAgent(t testing.TB, backend string, env ...string) *testAgent {
	dir, err := os.MkdirTemp("/tmp", "runlock-go-")
	if err != nil {
		t.Fatal(err)
	}
	a := &testAgent{socket: filepath.Join(dir, "agent.sock"), dir: dir, exited: make(chan struct{})}
	uri := backend
	switch backend {
	case "memory":
		uri = "memory://"
	case "file":
		uri = "file://" + filepath.Join(dir, "locks")
	}
	config := filepath.Join(dir, "agent.toml")
	if err := os.WriteFile(config, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	a.proc = exec.Command(runlockd(t), "--config", config, "--socket", a.socket, "--backend", uri)
	a.proc.Stdout, a.proc.Stderr = log, log
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RUNLOCK_") && !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "NOTIFY_") {
			a.proc.Env = append(a.proc.Env, kv)
		}
	}
	a.proc.Env = append(a.proc.Env, env...)
	if err := a.proc.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = a.proc.Wait()
		close(a.exited)
	}()
	t.Cleanup(func() {
		a.stop(syscall.SIGTERM)
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(agentStartTimeout)
	for {
		select {
		case <-a.exited:
			t.Fatalf("runlockd exited: %s", a.log())
		default:
		}
		if probe, err := net.Dial("unix", a.socket); err == nil {
			probe.Close()
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("runlockd did not listen within %s: %s", agentStartTimeout, a.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (a *testAgent) log() string {
	text, _ := os.ReadFile(filepath.Join(a.dir, "agent.log"))
	return string(text)
}

// stop ends the agent (SIGKILL if sig has not within the bound).
func (a *testAgent) stop(sig syscall.Signal) {
	select {
	case <-a.exited:
		return
	default:
	}
	_ = a.proc.Process.Signal(sig)
	select {
	case <-a.exited:
	case <-time.After(agentStartTimeout):
		_ = a.proc.Process.Kill()
		<-a.exited
	}
}

// s3Backend is a fresh bucket in moto at RUNLOCK_TEST_S3_ENDPOINT
// (scripts/test starts it) and the environment an agent needs to use it, as
// clients/python's tests do. Without the emulator the test is skipped, and
// fails in CI rather than pass unnoticed.
func s3Backend(t *testing.T) (string, []string) {
	endpoint := os.Getenv("RUNLOCK_TEST_S3_ENDPOINT")
	if endpoint == "" {
		why := "RUNLOCK_TEST_S3_ENDPOINT is not set (source tests/scripts/moto.sh; moto_start)"
		if os.Getenv("CI") != "" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	bucket := fmt.Sprintf("runlock-go-%d", time.Now().UnixNano())
	// moto accepts an unsigned bucket creation, as the Rust tests use it.
	request, err := http.NewRequest(http.MethodPut, endpoint+"/"+bucket, nil)
	if err != nil {
		t.Fatal(err)
	}
	response, err := (&http.Client{Timeout: 10 * time.Second}).Do(request)
	if err != nil {
		t.Fatal(err)
	}
	response.Body.Close()
	if response.StatusCode/100 != 2 {
		t.Fatalf("creating bucket %s: %s", bucket, response.Status)
	}
	return "s3://" + bucket + "/locks", []string{
		"AWS_ENDPOINT_URL=" + endpoint, "AWS_ENDPOINT_URL_S3=" + endpoint, "AWS_ACCESS_KEY_ID=test",
		"AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=us-east-1", "AWS_EC2_METADATA_DISABLED=true",
	}
}
