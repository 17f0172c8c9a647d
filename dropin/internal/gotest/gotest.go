// Package gotest runs `go test -json` in a directory and tallies what it
// reports: packages, and tests by outcome. The tests of this module run
// upstream's tests in a materialised copy of k8s.io/kubernetes with it.
package gotest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// Run is one `go test -json` invocation.
type Run struct {
	// Go is the go command; Dir is where it runs (a module's root).
	Go, Dir string
	// Args are go test's arguments after -json: flags and packages.
	Args []string
	// Env is added to the environment (GOWORK=off always is).
	Env []string
	// Log, if set, gets a line per finished package and per failed test,
	// as they come.
	Log io.Writer
}

// Summary is what a Run reported.
type Summary struct {
	// Packages maps each package to its outcome: pass, fail or skip (no
	// test files, or no tests ran), or "build failed".
	Packages map[string]string
	// Tests maps each test, "package.TestName/subtest", to pass, fail or
	// skip.
	Tests map[string]string
	// Output keeps each failed test's and failed package's output.
	Output map[string]string
	// Elapsed is the wall time of the run.
	Elapsed time.Duration
	// Err is the go command's error, if it failed to run at all or exited
	// non-zero.
	Err error
}

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// Do runs r and returns its Summary.
func (r Run) Do(ctx context.Context) Summary {
	s := Summary{Packages: map[string]string{}, Tests: map[string]string{}, Output: map[string]string{}}
	args := append([]string{"test", "-json"}, r.Args...)
	cmd := exec.CommandContext(ctx, r.Go, args...)
	cmd.Dir = r.Dir
	cmd.Env = append(append(os.Environ(), "GOWORK=off"), r.Env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.Err = err
		return s
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		s.Err = err
		return s
	}
	outputs := map[string]*strings.Builder{}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil {
			continue // build output that is not JSON
		}
		key := e.Package
		if e.Test != "" {
			key += "." + e.Test
		}
		switch e.Action {
		case "output", "build-output":
			if e.Action == "build-output" {
				key = e.Package
			}
			b := outputs[key]
			if b == nil {
				b = &strings.Builder{}
				outputs[key] = b
			}
			if b.Len() < 1<<20 {
				b.WriteString(e.Output)
			}
		case "build-fail":
			s.Packages[e.Package] = "build failed"
		case "pass", "fail", "skip":
			if e.Test != "" {
				s.Tests[key] = e.Action
			} else if s.Packages[e.Package] != "build failed" {
				s.Packages[e.Package] = e.Action
			}
			if e.Action == "fail" {
				if b := outputs[key]; b != nil {
					s.Output[key] = b.String()
				}
			}
			delete(outputs, key)
			if r.Log != nil && (e.Test == "" || e.Action == "fail") {
				fmt.Fprintf(r.Log, "%s %s\n", e.Action, key)
			}
		}
	}
	s.Err = cmd.Wait()
	s.Elapsed = time.Since(start)
	if s.Err != nil && len(s.Packages) == 0 {
		s.Err = fmt.Errorf("%w: %s", s.Err, stderr.Bytes())
	}
	for key, b := range outputs {
		if s.Packages[key] == "build failed" {
			s.Output[key] = b.String()
		}
	}
	return s
}

// Count returns the number of tests with outcome (pass, fail, skip) whose
// name matches keep (nil: all).
func (s Summary) Count(outcome string, keep func(test string) bool) int {
	n := 0
	for t, o := range s.Tests {
		if o == outcome && (keep == nil || keep(t)) {
			n++
		}
	}
	return n
}

// Failed lists the failed tests and packages, sorted.
func (s Summary) Failed() []string {
	var out []string
	for t, o := range s.Tests {
		if o == "fail" {
			out = append(out, t)
		}
	}
	for p, o := range s.Packages {
		if o == "fail" || o == "build failed" {
			out = append(out, p+" ("+o+")")
		}
	}
	sort.Strings(out)
	return out
}

// Leaves returns the tests that assert something themselves: those
// without subtests in s, and a parent that failed while none of its
// subtests did (it failed in its own code: its set-up, a check after its
// subtests, a cleanup — as a kube-apiserver that never starts fails the
// parent of upstream's integration tests). Other parents are left out: a
// parent fails when a subtest does, so counting it would count that
// failure twice.
func (s Summary) Leaves() map[string]string {
	names := make([]string, 0, len(s.Tests))
	for t := range s.Tests {
		names = append(names, t)
	}
	slices.Sort(names)
	out := map[string]string{}
	for i, t := range names {
		if i+1 >= len(names) || !strings.HasPrefix(names[i+1], t+"/") {
			out[t] = s.Tests[t]
			continue
		}
		if s.Tests[t] != "fail" {
			continue
		}
		subFailed := false
		for _, sub := range names[i+1:] {
			if !strings.HasPrefix(sub, t+"/") {
				break
			}
			if s.Tests[sub] == "fail" {
				subFailed = true
				break
			}
		}
		if !subFailed {
			out[t] = "fail"
		}
	}
	return out
}

// GoCommand returns the go command: "go" in PATH, else the one in
// runtime.GOROOT() (the toolchain that built the caller).
func GoCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	// The go command sets no GOROOT for the binaries it runs, and a test
	// binary's GOROOT is the toolchain that built it, on this machine.
	//lint:ignore SA1019 the fallback when go is not on PATH: the toolchain running the tests
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// StartupTimeout is the line upstream's integration framework
// (test/integration/framework/test_server.go) fails a test with when its
// kube-apiserver is not healthy within 10 seconds of starting: on a
// loaded machine, a failure of the environment, not of the test.
const StartupTimeout = "test_server.go:259: context deadline exceeded"

// OnlyStartupTimeouts reports whether s failed, and every failed test
// that asserts something itself (a leaf) failed with StartupTimeout.
func (s Summary) OnlyStartupTimeouts() bool {
	failed := 0
	for t, o := range s.Leaves() {
		if o != "fail" {
			continue
		}
		failed++
		if !strings.Contains(s.Output[t], StartupTimeout) {
			return false
		}
	}
	for _, o := range s.Packages {
		if o == "build failed" {
			return false
		}
	}
	return failed > 0
}
