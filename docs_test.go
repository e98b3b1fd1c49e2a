package kvtier

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// upstreamPaths are paths the docs name in other projects' trees.
var upstreamPaths = map[string]string{
	"tests/v1/kv_connector/unit/offloading_connector/": "vLLM's tests (scripts/vllm-harness.sh fetches them)",
}

// TestDocsNameOnlyPathsThatExist: every repository path the README and
// docs/ quote (`like/this.go`, under one of the repository's top-level
// directories) exists, so a newcomer following them finds what they name.
func TestDocsNameOnlyPathsThatExist(t *testing.T) {
	tops := topDirs(t)
	docs, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	quoted := regexp.MustCompile("`([^`\\s]+)`")
	checked := 0
	for _, doc := range append([]string{"README.md"}, docs...) {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, m := range quoted.FindAllStringSubmatch(string(text), -1) {
			path := strings.TrimRight(m[1], ".,;:)")
			path, _, _ = strings.Cut(path, ":") // file:line, test ids
			if !tops[strings.Split(path, "/")[0]] || !strings.Contains(path, "/") || strings.ContainsAny(path, "*<>{}$") {
				continue
			}
			if _, ok := upstreamPaths[path]; ok {
				continue
			}
			checked++
			_, err := os.Stat(strings.TrimSuffix(path, "/"))
			require.NoError(t, err, "%s names %s, which the repository lacks", doc, path)
		}
	}
	require.Greater(t, checked, 50, "the docs' paths were found")
}

// TestCommentsNameOnlyPathsThatExist: every repository path a Go comment
// names (tiers/cpu/state.go, internal/zmqx, a package's testdata/...)
// exists, from the repository's root or from the commenting file's folder;
// a path.Symbol names a package's identifier and needs its folder.
func TestCommentsNameOnlyPathsThatExist(t *testing.T) {
	tops := topDirs(t)
	var alt []string
	for top := range tops {
		alt = append(alt, regexp.QuoteMeta(top))
	}
	named := regexp.MustCompile(`(?:^|[^\w./-])((?:` + strings.Join(alt, "|") + `)/[A-Za-z0-9_./-]*[A-Za-z0-9_/])`)
	out, err := exec.Command("git", "ls-files", "*.go").Output()
	if err != nil {
		t.Skipf("no git work tree here: %v", err)
	}
	checked := 0
	for _, file := range strings.Fields(string(out)) {
		src, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, line := range strings.Split(string(src), "\n") {
			_, comment, ok := strings.Cut(line, "//")
			if !ok {
				continue
			}
			for _, m := range named.FindAllStringSubmatch(comment, -1) {
				path := strings.TrimRight(m[1], ".")
				if strings.ContainsAny(path, "*<>{}$") {
					continue
				}
				checked++
				require.True(t, pathExists(filepath.Dir(file), path), "%s names %s, which the repository lacks", file, path)
			}
		}
	}
	require.Greater(t, checked, 100, "the comments' paths were found")
}

// pathExists: path from the root or from dir, or path.Symbol with its
// folder there.
func pathExists(dir, path string) bool {
	path = strings.TrimSuffix(path, "/")
	candidates := []string{path, filepath.Join(dir, path)}
	if i := strings.LastIndex(path, "."); i > strings.LastIndex(path, "/") {
		candidates = append(candidates, path[:i], filepath.Join(dir, path[:i]))
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return true
		}
	}
	return false
}

func topDirs(t *testing.T) map[string]bool {
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	tops := map[string]bool{}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			tops[e.Name()] = true
		}
	}
	return tops
}

// TestRepositoryStandsAlone: nothing tracked reads the workspace's shared
// folder beside the clone (the trace and every file the tests and README
// use are in the repository: testdata/).
func TestRepositoryStandsAlone(t *testing.T) {
	outside := `\.\./` + "sha" + "red" // the sibling folder, spelled so this file does not name it
	out, err := exec.Command("git", "grep", "-l", "-I", outside, "--", ".", ":!docs_test.go").Output()
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
		return // git grep: no match
	}
	if err != nil {
		t.Skipf("no git work tree here: %v", err)
	}
	require.Empty(t, strings.TrimSpace(string(out)), "tracked files name the folder beside the clone")
}
