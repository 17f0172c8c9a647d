package dispatchprom

import (
	"fmt"

	"github.com/coalescer/dispatch"
	"github.com/prometheus/client_golang/prometheus"
)

// Describe sends the descriptors of every metric the Observer exports, the
// snapshot gauges included (whether or not a Stats source is set).
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range o.events {
		c.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{
		o.pending, o.queued, o.inFlight, o.keys, o.mode, o.breaker, o.tenantQueued, o.tenantInFlight,
		o.limit, o.reserved, o.belowReserve,
	} {
		ch <- d
	}
}

// Collect sends the event counters and histograms, then, if a Stats source
// is set, reads one snapshot and sends the gauges taken from it, so that
// they agree with each other. A source that panics sends no gauge but an
// invalid metric whose error names it, which fails the scrape; the
// counters and histograms are sent all the same.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	for _, c := range o.events {
		c.Collect(ch)
	}
	p := o.stats.Load()
	if p == nil {
		return
	}
	s, err := snapshot(*p)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(o.pending, err)
		return
	}
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	for ct, n := range o.pendingByType(s) {
		gauge(o.pending, n, ct)
	}
	gauge(o.queued, s.Ready, "ready")
	gauge(o.queued, s.Delayed, "delayed")
	gauge(o.queued, s.Successors, "successor")
	gauge(o.inFlight, s.InFlight)
	gauge(o.keys, s.Keys)
	gauge(o.mode, int(s.Mode))
	gauge(o.breaker, int(s.Circuit))
	gauge(o.limit, s.Concurrency)
	gauge(o.reserved, s.Reserved)
	gauge(o.belowReserve, s.BelowReserve)
	for t, q := range o.byTenant(s) {
		gauge(o.tenantQueued, q.Queued, t)
		gauge(o.tenantInFlight, q.InFlight, t)
	}
}

// snapshot reads stats, reporting a panic in it as an error that names
// the source and its likeliest cause: the Stats method of a Dispatcher not
// made yet, taken as Options.Stats before the Dispatcher that this Observer
// is given to was made.
func snapshot(stats func() dispatch.Stats) (s dispatch.Stats, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("dispatchprom: the Stats source (Options.Stats or SetStats) panicked: %v; "+
				"d.Stats of a Dispatcher d not made yet does this: give d.Stats to SetStats once d exists", v)
		}
	}()
	return stats(), nil
}

// pendingByType is s's pending calls by call-type label value. Types seen
// before but idle now are 0, "other" included once a type became it: a
// series that vanished would read as "no data", not as "none pending", and
// alerts on it would go quiet. Without
// Config.Label, Stats.Labels is nil and every call's label is "": the
// pending calls are all the calls queued or in flight.
func (o *Observer) pendingByType(s dispatch.Stats) map[string]int {
	pending := make(map[string]int, len(s.Labels))
	o.callTypes.each(func(ct string) { pending[ct] = 0 })
	if o.callTypes.overflowed() {
		pending[overflow] = 0
	}
	if s.Labels == nil {
		pending[o.callTypes.value("")] += s.Ready + s.Delayed + s.Successors + s.InFlight
		return pending
	}
	for l, n := range s.Labels {
		pending[o.callTypes.value(l)] += n
	}
	return pending
}

// byTenant is s's queued and in-flight calls by tenant label value, the
// tenants seen before included, as for pendingByType.
func (o *Observer) byTenant(s dispatch.Stats) map[string]dispatch.TenantStats {
	out := make(map[string]dispatch.TenantStats, len(s.Tenants))
	o.tenants.each(func(t string) { out[t] = dispatch.TenantStats{} })
	if o.tenants.overflowed() {
		out[overflow] = dispatch.TenantStats{}
	}
	for name, ts := range s.Tenants {
		t := o.tenants.value(name)
		q := out[t]
		q.Queued += ts.Queued
		q.InFlight += ts.InFlight
		out[t] = q
	}
	return out
}
