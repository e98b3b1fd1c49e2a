package kvtier

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/kvtier/kvtier"

// TestInternalIsTheGroundFloor: internal/ holds leaf utilities (codecs,
// sockets, defaults, test helpers) that every layer may use, so nothing
// under it imports a package of this module outside internal/ — test files
// included. Wiring lives in node/, tools in tools/ (owned by cmd/kvtier).
func TestInternalIsTheGroundFloor(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir("internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, spec := range f.Imports {
			p, _ := strconv.Unquote(spec.Path.Value)
			if p == module || strings.HasPrefix(p, module+"/") && !strings.HasPrefix(p, module+"/internal/") {
				t.Errorf("%s imports %s: internal/ may import only internal/ of this module", path, p)
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, checked, 20, "internal/'s files were read")
}

// TestDaemonLinksNoTool: kvtierd is the node and nothing else; the tools
// (benchmarks, the chaos harness, the simulator, the fleet runner, the
// sizing calculator) and the core test kits are cmd/kvtier's.
func TestDaemonLinksNoTool(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", module+"/cmd/kvtierd").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	deps := strings.Fields(string(out))
	require.Contains(t, deps, module+"/node", "the listing is kvtierd's")
	for _, p := range deps {
		if strings.HasPrefix(p, module+"/tools/") || strings.HasPrefix(p, module+"/internal/testutil/") ||
			p == module+"/supervision/fxlog" || p == module+"/supervision/modeltime" {
			t.Errorf("kvtierd links %s (go list -deps ./cmd/kvtierd)", p)
		}
	}
}
