package gotest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRun runs go test -json on a package made for it and tallies it.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		require.NoError(t, writeFile(dir, name, content))
	}
	write("go.mod", "module example.com/m\n\ngo 1.26\n")
	write("m_test.go", `package m

import "testing"

func TestPass(t *testing.T) {
	t.Run("a", func(t *testing.T) {})
	t.Run("b", func(t *testing.T) {})
}

func TestFail(t *testing.T) { t.Log("why it failed") ; t.Fail() }

func TestSkip(t *testing.T) { t.Skip("not today") }

func TestSetUp(t *testing.T) {
	t.Run("c", func(t *testing.T) {})
	t.Error("failed in its own code, after its subtests passed")
}

func TestSub(t *testing.T) {
	t.Run("d", func(t *testing.T) { t.Fail() })
}
`)
	s := Run{Go: GoCommand(), Dir: dir, Args: []string{"-count=1", "."}}.Do(t.Context())
	assert.Error(t, s.Err, "go test exits non-zero when a test fails")
	assert.Equal(t, map[string]string{"example.com/m": "fail"}, s.Packages)
	assert.Equal(t, map[string]string{
		"example.com/m.TestPass": "pass", "example.com/m.TestPass/a": "pass", "example.com/m.TestPass/b": "pass",
		"example.com/m.TestFail": "fail", "example.com/m.TestSkip": "skip",
		"example.com/m.TestSetUp": "fail", "example.com/m.TestSetUp/c": "pass",
		"example.com/m.TestSub": "fail", "example.com/m.TestSub/d": "fail",
	}, s.Tests)
	assert.Equal(t, map[string]string{
		"example.com/m.TestPass/a": "pass", "example.com/m.TestPass/b": "pass",
		"example.com/m.TestFail": "fail", "example.com/m.TestSkip": "skip",
		"example.com/m.TestSetUp": "fail", "example.com/m.TestSetUp/c": "pass",
		"example.com/m.TestSub/d": "fail",
	}, s.Leaves(), "a parent is counted only when it failed and none of its subtests did")
	assert.Equal(t, 4, s.Count("pass", nil))
	assert.Equal(t, []string{"example.com/m (fail)", "example.com/m.TestFail", "example.com/m.TestSetUp",
		"example.com/m.TestSub", "example.com/m.TestSub/d"}, s.Failed())
	assert.Contains(t, s.Output["example.com/m.TestSetUp"], "failed in its own code")
	assert.Contains(t, s.Output["example.com/m.TestFail"], "why it failed")
	assert.False(t, s.OnlyStartupTimeouts())
}

func TestOnlyStartupTimeouts(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Summary
		want bool
	}{
		{"nothing failed", Summary{Tests: map[string]string{"p.T": "pass"}}, false},
		{"a start-up timeout", Summary{
			Tests:  map[string]string{"p.T": "fail", "p.T/a": "fail", "p.T/b": "pass"},
			Output: map[string]string{"p.T/a": "   " + StartupTimeout + "\n"},
		}, true},
		{"another failure too", Summary{
			Tests:  map[string]string{"p.T/a": "fail", "p.T/b": "fail"},
			Output: map[string]string{"p.T/a": StartupTimeout, "p.T/b": "want 1, got 2"},
		}, false},
		{"a build failure", Summary{
			Tests:    map[string]string{"p.T/a": "fail"},
			Output:   map[string]string{"p.T/a": StartupTimeout},
			Packages: map[string]string{"q": "build failed"},
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.s.OnlyStartupTimeouts())
		})
	}
	assert.True(t, strings.HasPrefix(StartupTimeout, "test_server.go:"))
}
