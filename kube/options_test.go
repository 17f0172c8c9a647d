package kube

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLowestPriorities: priorities at the bottom of the int range, where a
// band's first priority lies below it, are accepted as any others. The
// preset used to compute the reservation's band start as band × width,
// which wraps for the lowest eight ints, and NewDispatcher failed naming
// Config.Start.UrgentPriority — a field the caller cannot set, with a
// value it never gave.
func TestLowestPriorities(t *testing.T) {
	for off := range 12 {
		p := math.MinInt + off
		t.Run(fmt.Sprintf("MinInt+%d", off), func(t *testing.T) {
			d, err := NewDispatcher(newFakeAPI().client(), Options{Priorities: map[CallType]int{PodBinding: p, PodDeletion: p, PodStatusPatch: p}})
			require.NoError(t, err)
			s := d.Stats()
			assert.Equal(t, 16/4, s.Reserved)
			require.NoError(t, d.Close(t.Context()))
		})
	}
	_, err := NewDispatcher(newFakeAPI().client(), Options{Priorities: map[CallType]int{PodBinding: math.MinInt + 5, PodStatusPatch: math.MinInt}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Options.Priorities", "a status patch below the binding in the lowest band is named as the caller set it")
}

// TestAgingBandTooWideIsNamed: an AgingBand wide enough to put the status
// patches' priority in the band of the bindings' or deletions' is refused
// naming AgingBand, which the caller set, first — not Priorities alone,
// which a caller who left it unset would look for in vain.
func TestAgingBandTooWideIsNamed(t *testing.T) {
	for _, o := range []Options{
		{AgingBand: 30},
		{AgingBand: math.MaxInt},
		{AgingBand: 11, Priorities: map[CallType]int{PodDeletion: 10, PodStatusPatch: 1}},
	} {
		_, err := NewDispatcher(newFakeAPI().client(), o)
		require.Error(t, err)
		assert.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("kube: Options.AgingBand %d ", o.AgingBand)), "%v", err)
		assert.Contains(t, err.Error(), "in one priority band", "says why")
	}
	// Priorities alone that share a band of the default width are
	// Priorities' fault.
	_, err := NewDispatcher(newFakeAPI().client(), Options{Priorities: map[CallType]int{PodDeletion: 5}})
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "kube: Options.Priorities "), "%v", err)
}

// TestAgingBandDocBound: the AgingBand doc's bound for the default
// priorities holds: the width it names is accepted, one more is refused.
func TestAgingBandDocBound(t *testing.T) {
	src, err := os.ReadFile("options.go")
	require.NoError(t, err)
	m := regexp.MustCompile(`with the\s+//\s+default priorities \(0, 10, 20\), it must be at most (\d+)\.`).FindSubmatch(src)
	require.NotNil(t, m, "the AgingBand doc states its bound")
	w, err := strconv.Atoi(string(m[1]))
	require.NoError(t, err)
	_, _, err = presetConfig(Options{AgingBand: w})
	assert.NoError(t, err)
	_, _, err = presetConfig(Options{AgingBand: w + 1})
	assert.ErrorContains(t, err, "Options.AgingBand")
}

// TestReservedWorkersAsDocumented: the README and the package doc say how
// many workers the preset keeps for bindings and deletions — a quarter, at
// least one, none of a single worker — rather than that a binding always
// finds a free worker, which no reservation gives a single worker.
func TestReservedWorkersAsDocumented(t *testing.T) {
	for _, f := range []string{"README.md", "doc.go"} {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		text := strings.Join(strings.Fields(strings.ReplaceAll(string(src), "//", "")), " ")
		assert.Contains(t, text, "a quarter of the workers (at least one; none of a single worker", f)
		assert.NotContains(t, text, "always finds a free worker", f)
	}
	for workers, want := range map[int]int{1: 0, 2: 1, 7: 1, 8: 2, 16: 4} {
		d, err := NewDispatcher(newFakeAPI().client(), Options{Workers: workers})
		require.NoError(t, err)
		assert.Equal(t, want, d.Stats().Reserved, "%d workers", workers)
		require.NoError(t, d.Close(t.Context()))
	}
}
