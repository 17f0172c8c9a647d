package upstream

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// PerfClientTag is the build tag that gives scheduler_perf's scheduler, in a
// materialised copy, a client of its own at the QPS and burst of its
// configuration's clientConnection — kube-scheduler's 50 and 100 unless a
// workload's scheduler configuration says otherwise — as kube-scheduler's
// own client has in a cluster.
//
// As released, test/integration/scheduler_perf gives the scheduler the
// harness's client, at 5 000 QPS and burst 5 000 whatever the configuration
// says (util.go, with upstream's TODO to derive them from the
// configuration "when there is any testcase that depends on such
// configuration"). kubernetes#135900 is such a case: a binding waits behind
// status patches only where a token bucket queues them. The tag is that
// TODO: the harness's own requests (creating nodes and pods, its
// controllers) keep the harness's client; the scheduler and its informers
// get one made from the same configuration at the configured rate, and its
// event broadcaster another, with a bucket of its own, as kube-scheduler
// gives its events (StartSchedulerWithDone takes the events API from the
// scheduler's clientset: with one bucket for both, the broadcaster would
// take every other token from the scheduler's calls).
//
// Without the tag, a copy's scheduler_perf behaves as released: the copy's
// util.go calls a function that returns the harness's context unchanged.
const PerfClientTag = "dispatch_perf_client"

// perfDir is scheduler_perf's directory in the module.
const perfDir = "test/integration/scheduler_perf"

// The call in perfDir's util.go that starts the scheduler, as released and
// as the copy has it.
var (
	perfCall        = []byte("util.StartSchedulerWithDone(tCtx, config, opts.outOfTreePluginRegistry)")
	perfCallInCopy  = []byte("util.StartSchedulerWithDone(dispatchSchedulerClient(tCtx, config), config, opts.outOfTreePluginRegistry)")
	perfClientFiles = map[string]string{
		"zz_dispatch_perf_client.go":     perfClientOn,
		"zz_dispatch_perf_client_off.go": perfClientOff,
	}
)

const perfClientHeader = `// Placed by github.com/coalescer/dispatch/dropin
// (materialise): with -tags ` + PerfClientTag + `, the scheduler's client
// takes its QPS and burst from the scheduler's configuration.

package benchmark
`

const perfClientOn = `//go:build ` + PerfClientTag + `

` + perfClientHeader + `
import (
	clientset "k8s.io/client-go/kubernetes"
	eventsv1 "k8s.io/client-go/kubernetes/typed/events/v1"
	restclient "k8s.io/client-go/rest"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/test/utils/client-go/ktesting"
)

// dispatchSchedulerClient returns tCtx with clients at the QPS and burst of
// cfg's clientConnection, for the scheduler and its informers, and a
// clientset of their own, at the same rate, for its events — as
// kube-scheduler has: the event broadcaster does not take the scheduler's
// tokens.
func dispatchSchedulerClient(tCtx ktesting.TContext, cfg *config.KubeSchedulerConfiguration) ktesting.TContext {
	rc := restclient.CopyConfig(tCtx.RESTConfig())
	rc.QPS, rc.Burst = cfg.ClientConnection.QPS, int(cfg.ClientConnection.Burst)
	tCtx.Logf("the scheduler's client and its events' client: QPS %v, burst %d each (its configuration's clientConnection; -tags ` + PerfClientTag + `)", rc.QPS, rc.Burst)
	tCtx = tCtx.WithRESTConfig(rc)
	events := clientset.NewForConfigOrDie(tCtx.RESTConfig())
	client := dispatchSchedulerClientset{Interface: tCtx.Client(), events: events.EventsV1()}
	return tCtx.WithClients(tCtx.RESTConfig(), tCtx.RESTMapper(), client, tCtx.Dynamic(), tCtx.APIExtensions())
}

// dispatchSchedulerClientset is the scheduler's clientset with the events
// API of another.
type dispatchSchedulerClientset struct {
	clientset.Interface
	events eventsv1.EventsV1Interface
}

func (c dispatchSchedulerClientset) EventsV1() eventsv1.EventsV1Interface { return c.events }
`

const perfClientOff = `//go:build !` + PerfClientTag + `

` + perfClientHeader + `
import (
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/test/utils/client-go/ktesting"
)

// dispatchSchedulerClient returns tCtx: the scheduler shares the harness's
// clients, as released.
func dispatchSchedulerClient(tCtx ktesting.TContext, _ *config.KubeSchedulerConfiguration) ktesting.TContext {
	return tCtx
}
`

// patchPerfHarness makes scheduler_perf's scheduler client in the copy at
// root follow PerfClientTag: it writes the two files and changes the one
// call in util.go, once (a copy that has it already is left as it is). A
// util.go with neither the released call nor the changed one is refused:
// the patch is written for Version's harness.
func patchPerfHarness(root string) error {
	dir := filepath.Join(root, filepath.FromSlash(perfDir))
	util := filepath.Join(dir, "util.go")
	data, err := os.ReadFile(util)
	if err != nil {
		return err
	}
	switch released, copied := bytes.Count(data, perfCall), bytes.Count(data, perfCallInCopy); {
	case released == 1 && copied == 0:
		if err := writeAtomic(util, bytes.Replace(data, perfCall, perfCallInCopy, 1)); err != nil {
			return err
		}
	case released == 0 && copied == 1:
	default:
		return fmt.Errorf("materialise: %s does not start the scheduler as %s's does (%s): the patch for %s is written for that release", util, Version, perfCall, PerfClientTag)
	}
	for name, src := range perfClientFiles {
		if err := writeAtomic(filepath.Join(dir, name), []byte(src)); err != nil {
			return err
		}
	}
	return nil
}
