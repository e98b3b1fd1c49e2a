package messages

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// publicVocabulary is every type messages exports. Each crosses a package
// boundary: a protocol private to one actor lives beside that actor
// (tiers/cpu/cpumsg, tiers/tiermsg, tiers/tiering/tieringmsg, peer/peermsg).
// Adding a type here is a decision: the test below fails until the list
// names it, and fails for a type no other package uses.
var publicVocabulary = []string{
	"Ack", "CompleteLoad", "CompleteStore", "CreditGrant", "Event", "EventKind",
	"GeometryStats", "GetStats", "Grant", "HasPendingWork", "Holder", "InventoryResult", "JobDone",
	"EngineSession", "EngineTopic", "JobID", "JobKind", "JobRef", "Key", "Layout", "LoadJob", "Lookup",
	"LookupStatus", "Namespace", "Origin", "Pause", "PeerStats", "Placement",
	"PrepareLoad", "PrepareStore", "Provenance", "ReleaseSession", "Reply",
	"ReqContext", "RequestFinished", "ResetCache", "Result", "Resume",
	"SecondaryStats", "SessionReleased", "Shutdown", "Stats", "StoreBound",
	"StoreCredited", "StorePlan", "TakeEvents", "TierInventory", "TieringStats",
	"Touch",
}

// unnamedOutside are shared types other packages receive without naming.
var unnamedOutside = map[string]string{
	"Result": "the element of a Reply channel: every caller receives one",
}

func TestMessagesExportsOnlySharedTypes(t *testing.T) {
	exported := exportedTypes(t)
	missing, extra := diff(exported, publicVocabulary)
	require.Empty(t, missing, "messages exports types publicVocabulary does not list: a private protocol belongs beside its actor")
	require.Empty(t, extra, "publicVocabulary lists types messages no longer exports")

	used := usesOutside(t, exported)
	for _, name := range exported {
		if _, ok := unnamedOutside[name]; ok {
			continue
		}
		require.Greater(t, used[name], 0, "messages.%s is used by no other package's code: move it beside its only user", name)
	}
}

// exportedTypes are the type names messages' non-test files declare.
func exportedTypes(t *testing.T) []string {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		require.NoError(t, err)
		for _, d := range file.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				if name := s.(*ast.TypeSpec).Name.Name; ast.IsExported(name) {
					names = append(names, name)
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

// usesOutside counts, per name, the selector expressions messages.Name in
// the module's non-test Go files outside this package.
func usesOutside(t *testing.T, names []string) map[string]int {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	used := map[string]int{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if base := d.Name(); path != ".." && (strings.HasPrefix(base, ".") || base == "testdata" || base == "messages" || base == "clients") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		file, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "messages" && want[sel.Sel.Name] {
					used[sel.Sel.Name]++
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	return used
}

func diff(got, want []string) (missing, extra []string) {
	for _, g := range got {
		if !slices.Contains(want, g) {
			missing = append(missing, g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			extra = append(extra, w)
		}
	}
	return missing, extra
}
