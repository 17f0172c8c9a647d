package dispatchprom_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/coalescer/dispatch"
	dispatchprom "github.com/coalescer/dispatch/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

type Call struct{ Type string }

func Example() {
	obs, err := dispatchprom.NewObserver(dispatchprom.Options{Namespace: "scheduler"})
	if err != nil {
		panic(err)
	}
	d, err := dispatch.New(
		func(ctx context.Context, uid string, c Call) error { return nil }, // the API call
		dispatch.Config[string, Call]{
			Observer: obs,
			Label:    func(uid string, c Call) string { return c.Type },
		},
	)
	if err != nil {
		panic(err)
	}
	obs.SetStats(d.Stats)
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	reg.MustRegister(obs)

	ctx := context.Background()
	t, err := d.Submit(ctx, "pod-uid-1", Call{Type: "bind"}, dispatch.SubmitOptions{Priority: 10})
	if err != nil {
		panic(err)
	}
	t.Wait(ctx)
	d.Close(ctx)

	fams, _ := reg.Gather()
	for _, f := range fams {
		switch f.GetName() {
		case "scheduler_async_api_call_execution_total", "scheduler_pending_async_api_calls", "scheduler_submissions_total":
			for _, m := range f.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
				fmt.Printf("%s{%s} %v\n", f.GetName(), strings.Join(labels, ","), v)
			}
		}
	}
	// Output:
	// scheduler_async_api_call_execution_total{call_type="bind",result="succeeded"} 1
	// scheduler_pending_async_api_calls{call_type="bind"} 0
	// scheduler_submissions_total{call_type="bind",tenant=""} 1
}
