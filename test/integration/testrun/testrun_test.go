package testrun

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSelected(t *testing.T) {
	for _, tc := range []struct {
		run, skip string
		want      bool
	}{
		{"", "", true},
		{"TestStorm", "", true},
		{"Storm", "", true},                   // unanchored
		{"^TestStorm$", "", true},             // anchored
		{"^(TestA|TestStorm)$", "", true},     // alternatives
		{"^TestA$", "", false},                // another test
		{"TestStorm/high", "", true},          // a subtest of it
		{"TestOther/TestStorm", "", false},    // the first element decides
		{"(", "", true},                       // a bad pattern: the testing package says so
		{"", "TestStorm", false},              // skipped
		{"", "TestStorm/high", true},          // only a subtest skipped
		{"TestStorm", "TestOther", true},      // another test skipped
		{"^TestStorm$", "^TestStorm$", false}, // selected and skipped
	} {
		assert.Equal(t, tc.want, selected("TestStorm", tc.run, tc.skip), "-run %q -skip %q", tc.run, tc.skip)
	}
}

func TestSelectedReadsFlags(t *testing.T) {
	// This very test is selected, whatever -run chose it.
	assert.True(t, Selected(t.Name()))
}
