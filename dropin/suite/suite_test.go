// Package suite runs upstream's own scheduler tests with
// SchedulerAsyncAPICalls on, against the drop-in and against upstream's
// own api_dispatcher package, and compares the two. It runs only when
// asked (-suite): it takes hours on two cores.
//
//	go test ./dropin/suite -run TestUpstreamSuite -suite -timeout 12h -v
//
// Both runs use the same materialised copy of k8s.io/kubernetes with the
// gate on by default (the build tag dispatch_gate_on; tests that set the
// gate themselves still run with both values); the baseline adds the tag
// dispatch_upstream, which selects upstream's package. The report —
// packages and tests by outcome for each, and every test that passes with
// upstream's package and not with ours — goes to the test log and, with
// -suite-report FILE, to a Markdown file.
package suite

import (
	"context"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coalescer/dispatch/dropin"
	"github.com/coalescer/dispatch/dropin/internal/gotest"
	"github.com/coalescer/dispatch/test/integration/apiserver"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var (
	run     = flag.Bool("suite", false, "run upstream's scheduler tests against the drop-in and against upstream's package (hours)")
	report  = flag.String("suite-report", "", "write the report, in Markdown, to this file")
	only    = flag.String("suite-only", "", "run only the parts whose name contains this (unit, integration, perf)")
	norace  = flag.Bool("suite-norace", false, "run the unit tests without the race detector")
	timeout = flag.Duration("suite-timeout", 3*time.Hour, "go test -timeout for each part")
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// part is one go test invocation, run for both dispatchers.
type part struct {
	name string
	args []string
	// keep selects the tests the part reports on; nil: all.
	keep func(test string) bool
	// etcd says the tests need etcd on PATH. They are integration tests,
	// which run as upstream's CI runs them
	// (hack/make-rules/test-integration.sh): with -short and without the
	// race detector (under it, upstream's integration framework reports a
	// race of its own, between framework.EtcdMain's etcd-output logger and
	// testing.M.Run, with either dispatcher). Unit tests run with -race, as
	// hack/make-rules/test.sh runs them.
	etcd bool
}

const perf = "k8s.io/kubernetes/test/integration/scheduler_perf/"

var parts = []part{
	{name: "unit: pkg/scheduler/...", args: []string{"./pkg/scheduler/..."}},
	{name: "integration: bind, eventhandler, preemption/...", etcd: true, args: []string{
		"./test/integration/scheduler/bind",
		"./test/integration/scheduler/eventhandler",
		"./test/integration/scheduler/preemption/...",
	}},
	{name: "integration: rescheduling_test.go", etcd: true, args: []string{"-run", "^TestReScheduling$", "./test/integration/scheduler"}},
	{
		// The integration-test workloads of the two packages whose
		// configurations enable the gate; the report counts those that do
		// (their names end in _AsyncAPICallsEnabled), of all that ran.
		name: "perf: scheduler_perf integration-test workloads with SchedulerAsyncAPICalls",
		etcd: true,
		args: []string{"-run", "^TestSchedulerPerf$", perf + "misc", perf + "default_preemption"},
		keep: func(test string) bool { return strings.Contains(test, "AsyncAPICallsEnabled") },
	},
}

// side is one dispatcher's build.
type side struct {
	name string
	tags string
}

var sides = []side{
	{"dispatch (drop-in)", upstream.GateOnTag},
	{"upstream's package", upstream.GateOnTag + "," + upstream.BaselineTag},
}

// TestUpstreamSuite runs each part for both sides and compares: a test
// that passes with upstream's package must pass with ours.
func TestUpstreamSuite(t *testing.T) {
	if !*run {
		t.Skip("run with -suite: upstream's tests, twice, take hours")
	}
	tree, err := upstream.Materialise(context.Background(), upstream.Options{Local: upstream.LocalCheckout(), Log: os.Stderr})
	require.NoError(t, err)
	etcd, err := apiserver.EtcdBinary(t)
	require.NoError(t, err)
	path := "PATH=" + filepath.Dir(etcd) + string(os.PathListSeparator) + os.Getenv("PATH")

	private, err := privateTests(tree.Dir)
	require.NoError(t, err)
	t.Logf("left out of the comparison, as tests of upstream's private types: %v", private)
	isPrivate := func(test string) bool {
		name, ok := strings.CutPrefix(test, upstream.Package+".")
		top, _, _ := strings.Cut(name, "/")
		return ok && slices.Contains(private, top)
	}

	var md strings.Builder
	fmt.Fprintf(&md, "Upstream's tests with SchedulerAsyncAPICalls on by default (-tags %s), k8s.io/kubernetes %s, %s; unit tests with -race, integration tests with -short (as upstream's CI runs them).\n\n", upstream.GateOnTag, upstream.Version, time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&md, "Tests are counted as leaves (a test without subtests, or a subtest without subtests of its own), and a parent that failed while none of its subtests did counts as a test of its own. Upstream's tests of its private types, %s (in call_queue_test.go and goroutines_limiter_test.go), run only with upstream's package and are left out of both counts: they do not apply to a replacement.\n\n", strings.Join(private, ", "))
	fmt.Fprintf(&md, "| part | dispatcher | packages (ok / failed) | tests pass | fail | skip | time |\n|---|---|---|---|---|---|---|\n")
	var commands []string
	var regressions, flaky, bothFail []string
	for _, p := range parts {
		if *only != "" && !strings.Contains(p.name, *only) {
			continue
		}
		results := map[string]gotest.Summary{}
		for _, s := range sides {
			r := gotest.Run{Go: gotest.GoCommand(), Dir: tree.Dir, Args: append(flagsFor(p, s), p.args...), Log: os.Stderr}
			if p.etcd {
				r.Env = []string{path}
			}
			command := "go test " + strings.Join(r.Args, " ")
			if p.etcd {
				command = "PATH=$(dirname $ETCD_BIN):$PATH " + command
			}
			commands = append(commands, command)
			t.Logf("%s, %s: %s", p.name, s.name, command)
			sum := r.Do(t.Context())
			results[s.name] = sum
			leaves := keepOnly(keepOnly(sum.Leaves(), p.keep), not(isPrivate))
			okPkgs, badPkgs := 0, 0
			for _, o := range sum.Packages {
				switch o {
				case "pass", "skip":
					okPkgs++
				default:
					badPkgs++
				}
			}
			row := fmt.Sprintf("| %s | %s | %d / %d | %d | %d | %d | %v |", p.name, s.name, okPkgs, badPkgs,
				count(leaves, "pass"), count(leaves, "fail"), count(leaves, "skip"), sum.Elapsed.Round(time.Second))
			t.Log(row)
			fmt.Fprintln(&md, row)
		}
		ours := keepOnly(keepOnly(results[sides[0].name].Leaves(), p.keep), not(isPrivate))
		theirs := keepOnly(keepOnly(results[sides[1].name].Leaves(), p.keep), not(isPrivate))
		var suspects []string
		for _, test := range sortedKeys(theirs) {
			switch {
			case theirs[test] == "pass" && ours[test] != "pass":
				suspects = append(suspects, test)
			case theirs[test] == "fail" && ours[test] == "fail":
				bothFail = append(bothFail, test)
			}
		}
		// A test that passes with upstream's package and fails with ours is
		// run once more, alone, with ours: on a loaded machine some fail
		// for want of time (kube-apiserver's 10 s to start, say) on either
		// side. It is reported either way, and fails this test unless the
		// second run passes.
		rerun := rerunTests(t, tree.Dir, sides[0], p, path, suspects)
		for _, test := range suspects {
			first := results[sides[0].name].Output[test]
			if rerun[test] == "pass" {
				flaky = append(flaky, fmt.Sprintf("%s: %q with ours, then passed when run again", test, ours[test]))
				continue
			}
			regressions = append(regressions, fmt.Sprintf("%s: pass with upstream's package, %q with ours (and %q run again)", test, ours[test], rerun[test]))
			t.Errorf("passes with upstream's package, not with the drop-in: %s (%q, then %q)\n%s", test, ours[test], rerun[test], first)
		}
		for _, pkg := range sortedKeys(results[sides[0].name].Packages) {
			if o := results[sides[0].name].Packages[pkg]; o == "build failed" {
				t.Errorf("%s: %s with the drop-in\n%s", pkg, o, results[sides[0].name].Output[pkg])
			}
		}
	}
	fmt.Fprintf(&md, "\nThe commands, in the copy (`go run ./dropin/cmd/materialise -print dir`), with `GOWORK=off`:\n\n```sh\n%s\n```\n", strings.Join(commands, "\n"))
	fmt.Fprintf(&md, "\nTests that pass with upstream's package and not with the drop-in: %d.\n", len(regressions))
	for _, r := range regressions {
		fmt.Fprintf(&md, "- %s\n", r)
	}
	fmt.Fprintf(&md, "\nTests that failed with the drop-in and passed when run again (and pass with upstream's package): %d.\n", len(flaky))
	for _, f := range flaky {
		fmt.Fprintf(&md, "- %s\n", f)
	}
	fmt.Fprintf(&md, "\nTests that fail with both: %d.\n", len(bothFail))
	for _, f := range bothFail {
		fmt.Fprintf(&md, "- %s\n", f)
	}
	t.Log("\n" + md.String())
	if *report != "" {
		require.NoError(t, os.WriteFile(*report, []byte(md.String()), 0o644))
	}
}

// flagsFor returns go test's flags for part p on side s: unit tests with
// -race, integration tests with -short (see part.etcd).
func flagsFor(p part, s side) []string {
	flags := []string{"-count=1", "-timeout", timeout.String(), "-tags", s.tags}
	switch {
	case p.etcd:
		flags = append(flags, "-short")
	case !*norace:
		flags = append(flags, "-race")
	}
	return flags
}

// rerunTests runs tests (package.TestName/sub…) again for side s, each
// top-level test once, and returns the leaves' outcomes.
func rerunTests(t *testing.T, dir string, s side, p part, path string, tests []string) map[string]string {
	byPkg := map[string]map[string]bool{}
	for _, test := range tests {
		i := strings.Index(test, ".Test")
		if i < 0 {
			continue
		}
		pkg, name := test[:i], test[i+1:]
		top, _, _ := strings.Cut(name, "/")
		if byPkg[pkg] == nil {
			byPkg[pkg] = map[string]bool{}
		}
		byPkg[pkg][top] = true
	}
	out := map[string]string{}
	for _, pkg := range sortedKeys(byPkg) {
		var names []string
		for _, n := range sortedKeys(byPkg[pkg]) {
			names = append(names, regexp.QuoteMeta(n))
		}
		r := gotest.Run{Go: gotest.GoCommand(), Dir: dir, Args: append(flagsFor(p, s), "-run", "^("+strings.Join(names, "|")+")$", pkg), Log: os.Stderr}
		if p.etcd {
			r.Env = []string{path}
		}
		t.Logf("again, %s: go test %s", s.name, strings.Join(r.Args, " "))
		for k, v := range r.Do(t.Context()).Leaves() {
			out[k] = v
		}
	}
	return out
}

// privateTests returns the top-level tests of upstream's private types:
// those defined in the package's call_queue_test.go and
// goroutines_limiter_test.go, which the copy keeps behind the baseline tag.
func privateTests(copyDir string) ([]string, error) {
	var names []string
	for _, file := range []string{"call_queue_test.go", "goroutines_limiter_test.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(copyDir, "pkg", "scheduler", "backend", "api_dispatcher", file), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") {
				names = append(names, fn.Name.Name)
			}
		}
	}
	slices.Sort(names)
	return names, nil
}

func not(f func(string) bool) func(string) bool {
	return func(s string) bool { return !f(s) }
}

func keepOnly(m map[string]string, keep func(string) bool) map[string]string {
	if keep == nil {
		return m
	}
	out := map[string]string{}
	for k, v := range m {
		if keep(k) {
			out[k] = v
		}
	}
	return out
}

func count(m map[string]string, outcome string) int {
	n := 0
	for _, o := range m {
		if o == outcome {
			n++
		}
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
