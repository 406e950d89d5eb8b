package runlock

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

func TestVersionIsTheWorkspaces(t *testing.T) {
	cargo, err := os.ReadFile(filepath.Join(repoRoot(t), "Cargo.toml"))
	if err != nil {
		t.Fatal(err)
	}
	found := regexp.MustCompile(`\[workspace\.package\][^\[]*?\nversion = "([^"]+)"`).FindSubmatch(cargo)
	if found == nil {
		t.Fatal("no [workspace.package] version in Cargo.toml")
	}
	if string(found[1]) != Version {
		t.Errorf("Version is %s, the workspace's %s", Version, found[1])
	}
}
