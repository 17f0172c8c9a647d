package dispatchprom

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// sample finds the series name{labels} (labels as name, value pairs, all
// of the series' labels but the constant ones) in what g gathers. It returns
// a counter's or gauge's value, or a histogram's sample count, and whether
// the series exists.
func sample(t *testing.T, g prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	t.Helper()
	require.Zero(t, len(labels)%2, "labels come in pairs")
	fams, err := g.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if v, ok := have[labels[i]]; !ok || v != labels[i+1] {
					continue series
				}
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), true
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue(), true
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
			t.Fatalf("%s: unexpected type %v", name, f.GetType())
		}
	}
	return 0, false
}

// value is sample for a series that must exist.
func value(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := sample(t, g, name, labels...)
	require.True(t, ok, "no series %s%v", name, labels)
	return v
}

// sum adds up every series of name (sample counts, for a histogram).
func sum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	fams, err := g.Gather()
	require.NoError(t, err)
	total := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				total += m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				total += m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return total
}

// labelValues lists every value label takes among all series in g.
func labelValues(t *testing.T, g prometheus.Gatherer, label string) map[string]bool {
	t.Helper()
	fams, err := g.Gather()
	require.NoError(t, err)
	vals := map[string]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					vals[lp.GetValue()] = true
				}
			}
		}
	}
	return vals
}
