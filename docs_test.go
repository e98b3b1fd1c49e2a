package kvtier

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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

// designDoc is the architecture document: the only DESIGN.md anything in
// the repository may cite, by its numbered sections (`## 3. …`, `### 2.1 …`).
const designDoc = "docs/DESIGN.md"

// TestCitationsResolve: every citation in the repository's text files (Go,
// Python, Markdown, YAML, scripts; tracked or not yet, but not ignored)
// resolves, so a reader who follows one lands where it points:
//   - a design section, `docs/DESIGN.md §n` (or §n.m; lists such as
//     "§3, §6" too), names a section docs/DESIGN.md has, and is written
//     with that path: a bare "DESIGN.md §n" or "DESIGN §n" cites a document
//     the repository does not have;
//   - a document under docs/ (docs/VLLM.md, say) exists;
//   - a heading, `docs/VLLM.md, "Heading"` (also `docs/VLLM.md ("Heading")`,
//     `docs/VLLM.md "Heading"`, `README, "Heading"`, `README's "Heading"`), is
//     the start of a heading of that document, any level, or of the bold
//     title a paragraph of it opens with.
//
// A citation may run over a line break (a comment's next line, its marker
// dropped); each is reported at the line where it starts.
func TestCitationsResolve(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Skipf("no git work tree here: %v", err)
	}
	idx := docIndex{}
	sections := idx.sections(t, designDoc)
	var design, docs, headings int
	for _, file := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if file == "docs_test.go" { // its own comments and patterns describe citations
			continue
		}
		text, ok := readText(t, file)
		if !ok {
			continue
		}
		for _, c := range findCitations(text) {
			where := fmt.Sprintf("%s:%d", file, c.line)
			switch {
			case c.section != "":
				design++
				if c.doc != designDoc {
					t.Errorf("%s: cites %q §%s; cite %s §n, the design the repository has", where, c.doc, c.section, designDoc)
				} else if !sections[c.section] {
					t.Errorf("%s: cites %s §%s, a section %s lacks", where, designDoc, c.section, designDoc)
				}
			case c.heading != "":
				headings++
				if !idx.exists(c.doc) {
					t.Errorf("%s: cites %s, which the repository lacks", where, c.doc)
				} else if !idx.hasHeading(t, c.doc, c.heading) {
					t.Errorf("%s: cites %s, %q: no heading of %s starts so", where, c.doc, c.heading, c.doc)
				}
			default:
				docs++
				if !idx.exists(c.doc) {
					t.Errorf("%s: cites %s, which the repository lacks", where, c.doc)
				}
			}
		}
	}
	require.Greater(t, design, 20, "the design citations were found")
	require.Greater(t, headings, 40, "the heading citations were found")
	require.Greater(t, docs, 50, "the document citations were found")
}

// TestDesignDocNumbersItsSections: docs/DESIGN.md's sections are numbered
// 1, 2, 3, … in order (subsections n.1, n.2, … under section n), so a
// citation "§n" names one section for good, and every "§n" the document
// itself refers to exists.
func TestDesignDocNumbersItsSections(t *testing.T) {
	text, err := os.ReadFile(designDoc)
	require.NoError(t, err)
	var top, sub int
	for _, h := range headingLines(string(text)) {
		m := numbered.FindStringSubmatch(h)
		if m == nil {
			continue
		}
		parts := strings.Split(m[1], ".")
		switch len(parts) {
		case 1:
			top++
			sub = 0
			require.Equal(t, strconv.Itoa(top), parts[0], "%s: %q is out of order", designDoc, h)
		case 2:
			sub++
			require.Equal(t, fmt.Sprintf("%d.%d", top, sub), m[1], "%s: %q is out of order", designDoc, h)
		}
	}
	require.GreaterOrEqual(t, top, 9, "%s has its sections", designDoc)
	sections := docIndex{}.sections(t, designDoc)
	for i, line := range strings.Split(string(text), "\n") {
		for _, m := range selfRef.FindAllStringSubmatch(line, -1) {
			require.True(t, sections[m[1]], "%s:%d: refers to §%s, a section it lacks", designDoc, i+1, m[1])
		}
	}
}

// selfRef is a section reference inside docs/DESIGN.md.
var selfRef = regexp.MustCompile(`§\s?(\d+(?:\.\d+)*)`)

// TestCitationFinderReadsEveryForm: the forms TestCitationsResolve checks
// are found where they are written, over line breaks too, and prose that
// only looks like one is not.
func TestCitationFinderReadsEveryForm(t *testing.T) {
	text := strings.Join([]string{
		`// An idle node wakes nothing (docs/DESIGN.md §2.2; measured by`, // 1
		`// bench idle). Pending work (docs/DESIGN.md §3, §6; seed 002)`,  // 2
		`// as the bare brief says (DESIGN.md §4 rule 3) or (DESIGN §9).`, // 3
		`// from docs/PERFORMANCE.md, "One node cache shared by N`,        // 4
		`// engines"; and docs/PROTOCOL.md ("Peer protocol").`,            // 5
		`    # docs/VLLM.md "The scheduler step" and README's "Peers"`,    // 6
		`path := "docs/PROTOCOL.md", "x"; see docs/CHAOS.md and "that"`,   // 7
		`(docs/DESIGN.md §4 "Leases",`,                                    // 8
		`§7): the handshake.`,                                             // 9
		`(docs/DESIGN.md`,                                                 // 10
		`// §10).`,                                                        // 11
	}, "\n")
	var got []string
	for _, c := range findCitations(text) {
		got = append(got, fmt.Sprintf("%d %s §%s %q", c.line, c.doc, c.section, c.heading))
	}
	require.Equal(t, []string{
		`1 docs/DESIGN.md §2.2 ""`,
		`2 docs/DESIGN.md §3 ""`, `2 docs/DESIGN.md §6 ""`,
		`3 DESIGN.md §4 ""`, `3 DESIGN §9 ""`,
		`4 docs/PERFORMANCE.md § "One node cache shared by N engines"`,
		`5 docs/PROTOCOL.md § "Peer protocol"`,
		`6 docs/VLLM.md § "The scheduler step"`, `6 README.md § "Peers"`,
		`7 docs/PROTOCOL.md § ""`, `7 docs/CHAOS.md § ""`,
		`8 docs/DESIGN.md §4 ""`, `8 docs/DESIGN.md §7 ""`,
		`10 docs/DESIGN.md §10 ""`,
	}, got)
}

// citation is one citation found in a text.
type citation struct {
	line    int    // 1-based, where it starts
	doc     string // the document as written: a path under docs/, README.md, or a design reference (DESIGN.md, DESIGN)
	section string // a design section number ("3", "2.1"); "" when none
	heading string // a quoted heading; "" when none
}

var (
	// designRef is a reference to a design document; designSection one
	// section number after it, or after the one before it ("§4 rule 3",
	// "§4 \"P2P\"" and "and" may sit between two).
	designRef     = regexp.MustCompile(`[\w./-]*\bDESIGN(?:\.md)?\b`)
	designSection = regexp.MustCompile(`^(?:\s+rule\s+\d+)?(?:[\s,]*"[^"]*")?[\s,;:(]*(?:and\s+)?§\s?(\d+(?:\.\d+)*)`)
	docRef        = regexp.MustCompile(`\bdocs/[A-Za-z0-9_-]+\.md\b`)
	readmeRef     = regexp.MustCompile(`\bREADME(?:\.md)?(?:'s)?\b`)
	// quotedHeading is a heading right after a document's name.
	quotedHeading = regexp.MustCompile(`^(?:,\s*|\s+\(?|\()"([^"]+)"`)
	// continuation is what starts a line that continues a comment.
	continuation = regexp.MustCompile(`^\s*(?://+|#+|\*+|--|>)?\s*`)
	numbered     = regexp.MustCompile(`^#+\s+(\d+(?:\.\d+)*)\.?\s`)
)

// findCitations finds the citations in text; one that runs over a line
// break is read with the next two lines joined on (their comment markers
// dropped) and reported at the line where it starts.
func findCitations(text string) []citation {
	lines := strings.Split(text, "\n")
	var out []citation
	for i, line := range lines {
		if !strings.Contains(line, "DESIGN") && !strings.Contains(line, "docs/") && !strings.Contains(line, "README") {
			continue // every citation starts with one of these, on its own line
		}
		window := line
		for j := i + 1; j < len(lines) && j <= i+2; j++ {
			window += " " + continuation.ReplaceAllString(lines[j], "")
		}
		type found struct {
			at int
			c  citation
		}
		var here []found
		for _, m := range designRef.FindAllStringIndex(window, -1) {
			if m[0] >= len(line) {
				break
			}
			doc := window[m[0]:m[1]]
			for rest := window[m[1]:]; ; {
				s := designSection.FindStringSubmatchIndex(rest)
				if s == nil {
					break
				}
				here = append(here, found{m[0], citation{line: i + 1, doc: doc, section: rest[s[2]:s[3]]}})
				rest = rest[s[1]:]
			}
		}
		for _, m := range docRef.FindAllStringIndex(window, -1) {
			if m[0] >= len(line) {
				break
			}
			if d := window[m[0]:m[1]]; d != designDoc || !designSection.MatchString(window[m[1]:]) {
				here = append(here, found{m[0], citation{line: i + 1, doc: d, heading: quoted(window[m[1]:])}})
			}
		}
		for _, m := range readmeRef.FindAllStringIndex(window, -1) {
			if m[0] >= len(line) {
				break
			}
			if h := quoted(window[m[1]:]); h != "" {
				here = append(here, found{m[0], citation{line: i + 1, doc: "README.md", heading: h}})
			}
		}
		slices.SortStableFunc(here, func(a, b found) int { return a.at - b.at })
		for _, f := range here {
			out = append(out, f.c)
		}
	}
	return out
}

// quoted is the heading quoted at the start of rest, "" when none.
func quoted(rest string) string {
	if m := quotedHeading.FindStringSubmatch(rest); m != nil {
		return strings.Join(strings.Fields(m[1]), " ")
	}
	return ""
}

// readText reads a repository file that is text: false for one gone from
// the work tree, a binary one or a large one.
func readText(t *testing.T, file string) (string, bool) {
	info, err := os.Stat(file)
	if err != nil || !info.Mode().IsRegular() || info.Size() > 8<<20 {
		return "", false
	}
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	if bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0 {
		return "", false
	}
	return string(b), true
}

// docIndex reads the cited documents' headings, once each.
type docIndex map[string][]string

func (d docIndex) exists(doc string) bool {
	info, err := os.Stat(doc)
	return err == nil && info.Mode().IsRegular()
}

// headings are doc's heading lines and the titles of its paragraphs that
// open with one in bold.
func (d docIndex) headings(t *testing.T, doc string) []string {
	if h, ok := d[doc]; ok {
		return h
	}
	text, err := os.ReadFile(doc)
	require.NoError(t, err)
	h := headingLines(string(text))
	for _, line := range strings.Split(string(text), "\n") {
		if m := boldLead.FindStringSubmatch(line); m != nil {
			h = append(h, m[1])
		}
	}
	d[doc] = h
	return h
}

// hasHeading: some heading (or bold paragraph title) of doc starts with
// heading, at a word's end (case and backticks aside).
func (d docIndex) hasHeading(t *testing.T, doc, heading string) bool {
	want := strings.ToLower(plain(heading))
	for _, h := range d.headings(t, doc) {
		h = strings.ToLower(plain(strings.TrimLeft(h, "#")))
		if rest, ok := strings.CutPrefix(h, want); ok && (rest == "" || !isWordByte(rest[0])) {
			return true
		}
	}
	return false
}

// sections are the numbers of doc's numbered headings.
func (d docIndex) sections(t *testing.T, doc string) map[string]bool {
	out := map[string]bool{}
	for _, h := range d.headings(t, doc) {
		if m := numbered.FindStringSubmatch(h); m != nil {
			out[m[1]] = true
		}
	}
	require.NotEmpty(t, out, "%s numbers its sections", doc)
	return out
}

// headingLines are a Markdown text's heading lines, fenced code left out.
func headingLines(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "```") || strings.HasPrefix(line, "~~~"):
			fenced = !fenced
		case !fenced && strings.HasPrefix(line, "#"):
			out = append(out, line)
		}
	}
	return out
}

// boldLead is a paragraph that opens with a bold title ("**Cancel and late
// writes.** ..."), which the docs cite as they cite headings.
var boldLead = regexp.MustCompile(`^\*\*([^*]+)\*\*`)

func plain(s string) string {
	return strings.Join(strings.Fields(strings.NewReplacer("`", "", "*", "").Replace(s)), " ")
}

func isWordByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}
