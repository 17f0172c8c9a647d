package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRun runs the program on a small cluster and checks its summary: every
// pod is bound, reported unschedulable, or failed with the reason; the
// injected faults were retried or found done by reading the pod back.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), &out, config{pods: 120, nodes: 4, perNode: 25, qps: -1}))
	t.Log("\n" + out.String())
	num := func(label string) int {
		m := regexp.MustCompile(label + `:\s+(\d+)`).FindStringSubmatch(out.String())
		require.NotNil(t, m, label)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	bound, unschedulable, failed := num("bound"), num("unschedulable"), num("bind failed")
	assert.Equal(t, 120, bound+unschedulable+failed)
	assert.Equal(t, 1, failed)
	assert.Contains(t, out.String(), "web-7 on node-", "the pod another scheduler bound")
	assert.Contains(t, out.String(), `already assigned to node "node-elsewhere"`)
	assert.GreaterOrEqual(t, unschedulable, 20)
	assert.Regexp(t, `dispatcher:\s+\d+ retries, [1-9]\d* found done by reading back, 1 calls failed`, out.String())
}

func TestRunRejectsBadFlags(t *testing.T) {
	assert.Error(t, run(t.Context(), &bytes.Buffer{}, config{pods: 0, nodes: 1, perNode: 1}))
}
