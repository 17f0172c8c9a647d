package storm

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var redrawFlag = flag.String("storm.redraw", "",
	"TestRedraw: rewrite results.md and the pictures in this `directory` from its results.json (written by -storm.out)")

// TestRedraw redraws a recorded run's pictures and tables, without running
// anything, when -storm.redraw names its directory.
func TestRedraw(t *testing.T) {
	if *redrawFlag == "" {
		t.Skip("no -storm.redraw directory")
	}
	b, err := os.ReadFile(filepath.Join(*redrawFlag, "results.json"))
	require.NoError(t, err)
	var results []*Result
	require.NoError(t, json.Unmarshal(b, &results))
	require.NoError(t, writeResults(*redrawFlag, results))
}

// TestWriteSVG draws two made-up runs and checks the picture is one
// well-formed SVG document with what it must show: for each run, its rate
// lines and one point per schedulable pod.
func TestWriteSVG(t *testing.T) {
	w := Workload{Nodes: 3, Unschedulable: 10, Schedulable: 4, HighPriority: 1000}
	run := func(name string, latency float64) *Result {
		r := &Result{Priority: "high", Scheduler: name, Workload: w, StormDrained: 2.5, LastBound: 1.5, BindP99: latency, Bucket: 0.5}
		for i := range w.Schedulable {
			created := float64(100 * i)
			r.Pods = append(r.Pods, PodTiming{Name: "p", Created: created, Bound: created + latency})
		}
		for i := range 6 {
			r.Rates = append(r.Rates, RateSample{At: float64(i) / 2, StatusPatches: 50, Bindings: float64(i % 2), Rejected: 1})
		}
		return r
	}
	var buf bytes.Buffer
	require.NoError(t, writeSVG(&buf, []*Result{run("upstream", 1200), run("dispatch", 20)}))

	n := map[string]int{}
	d := xml.NewDecoder(&buf)
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok {
			n[se.Name.Local]++
		}
	}
	assert.Equal(t, 1, n["svg"])
	assert.Equal(t, 2*3, n["polyline"], "three rate lines per run")
	assert.Equal(t, 2*w.Schedulable+1, n["circle"], "a point per pod, and the legend's")
}

// TestMeanMs takes a histogram's mean from the _sum and _count counters
// of the series a label selects, and says "-" for one never observed.
func TestMeanMs(t *testing.T) {
	c := map[string]float64{
		"h_sum{call_type=pod_binding,result=success}":        0.3,
		"h_count{call_type=pod_binding,result=success}":      2,
		"h_sum{call_type=pod_binding,result=error}":          0.1,
		"h_count{call_type=pod_binding,result=error}":        2,
		"h_sum{call_type=pod_status_patch,result=success}":   9,
		"h_count{call_type=pod_status_patch,result=success}": 1,
	}
	assert.Equal(t, "100.0", meanMs(c, "h", "call_type=pod_binding"))
	assert.Equal(t, "9000.0", meanMs(c, "h", "call_type=pod_status_patch"))
	assert.Equal(t, "1880.0", meanMs(c, "h", ""))
	assert.Equal(t, "-", meanMs(c, "h", "call_type=other"))
	assert.Equal(t, "-", meanMs(c, "g", ""))
}
