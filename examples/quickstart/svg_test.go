package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// elements parses an SVG document and counts its elements by name; it fails
// the test if the document is not well-formed XML.
func elements(t *testing.T, doc []byte) map[string]int {
	t.Helper()
	n := map[string]int{}
	dec := xml.NewDecoder(bytes.NewReader(doc))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return n
		}
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok {
			n[se.Name.Local]++
		}
	}
}

func TestWriteSVG(t *testing.T) {
	ms := time.Millisecond
	rs := []*report{
		{name: "priority",
			bindPoints:   []bindPoint{{at: 10 * ms, latency: 21 * ms, ok: true}, {at: 30 * ms, latency: 25 * ms, ok: true}},
			depthSamples: []depthSample{{0, 0}, {5 * ms, 40}, {10 * ms, 180}, {900 * ms, 0}}},
		{name: "FIFO",
			bindPoints:   []bindPoint{{at: 10 * ms, latency: 700 * ms, ok: true}, {at: 30 * ms, latency: 2 * time.Second, ok: false}},
			depthSamples: []depthSample{{0, 0}, {5 * ms, 60}, {1500 * ms, 3}}},
	}
	var buf bytes.Buffer
	require.NoError(t, writeSVG(&buf, rs, time.Second, 20*ms))
	n := elements(t, buf.Bytes())
	assert.Equal(t, 1, n["svg"])
	assert.Equal(t, 2, n["polyline"], "one depth line per run")
	assert.Equal(t, 3+2, n["circle"], "three successful binds, and a marker per run in the legend")
	assert.Equal(t, 1, n["path"], "one failed bind")
	assert.Contains(t, buf.String(), ">priority run<")
	assert.Contains(t, buf.String(), ">FIFO run<")
	assert.Contains(t, buf.String(), ">mean API call (20ms)<")
}

func TestTicks(t *testing.T) {
	assert.Equal(t, []float64{0, 500, 1000, 1500, 2000, 2500}, linearTicks(2100))
	assert.Len(t, linearTicks(0), 6, "an empty axis still gets 0..1")
	assert.Equal(t, []float64{0, 50, 100, 150, 200, 250}, linearTicks(210))
	assert.Equal(t, []float64{20, 100, 1000, 5000}, logTicks(21, 3100))
	assert.Equal(t, []float64{10, 100, 1000, 2000}, logTicks(13, 1410))
	assert.Equal(t, []float64{10, 20, 50, 100}, logTicks(12, 95))
	assert.Equal(t, []float64{20, 50}, logTicks(21, 48))
	assert.Equal(t, []float64{1, 2}, logTicks(1, 1))
	assert.Equal(t, "0.6", fmtTick(0.6000000000000001))
}

// TestRunSVG runs both workloads briefly with the picture on and checks that
// they recorded what the picture draws.
func TestRunSVG(t *testing.T) {
	c := config{
		pods: 20, burst: 1, bindEvery: 5 * time.Millisecond, bindTimeout: time.Second,
		latency: time.Millisecond, workers: 2, duration: 100 * time.Millisecond,
		drain: 5 * time.Second, compare: true, svg: "unused",
	}
	require.NoError(t, c.check())
	rs := []*report{run(c, false), run(c, true)}
	for _, r := range rs {
		require.Empty(t, r.broken, r.name)
		assert.NotEmpty(t, r.depthSamples, r.name)
		assert.Len(t, r.bindPoints, len(r.bindLatency), r.name)
	}
	var buf bytes.Buffer
	require.NoError(t, writeSVG(&buf, rs, c.duration, c.latency))
	n := elements(t, buf.Bytes())
	assert.Equal(t, 2, n["polyline"])
}
