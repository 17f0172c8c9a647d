package benchmarks

import (
	"context"

	"github.com/coalescer/dispatch/test/queuebench"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	apidispatcher "k8s.io/kubernetes/pkg/scheduler/backend/api_dispatcher"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
)

// kube-scheduler's own APIDispatcher (KEP-5229), as the scheduler uses it:
// one call type, calls keyed by object UID (here the key), a newer call for
// a UID merged into the queued one, and a buffered channel per call for its
// result, as the scheduler's API cacher makes for each binding. It has no
// priorities and no worker bound: it starts a goroutine per execution, so
// "4 workers" does not apply to it, and its priority mix is ignored, as the
// workqueue's is.

// benchCallType is the one call type; its relevance does not matter.
const benchCallType fwk.APICallType = "bench"

// kubeCall is one add: an API call whose execution is the workload's no-op.
type kubeCall struct {
	r   *queuebench.Run
	key string
}

func (c *kubeCall) CallType() fwk.APICallType { return benchCallType }
func (c *kubeCall) UID() types.UID            { return types.UID(c.key) }
func (c *kubeCall) Execute(context.Context, clientset.Interface) error {
	c.r.Started(c.key, -1)
	return nil
}

// Merge keeps the newer call as it is: the workload's calls carry nothing
// to merge, as a status patch of the same conditions would not.
func (c *kubeCall) Merge(fwk.APICall) error { return nil }

func (c *kubeCall) Sync(obj metav1.Object) (metav1.Object, error) { return obj, nil }
func (c *kubeCall) IsNoOp() bool                                  { return false }

// newE2EAPIDispatcher runs the upstream dispatcher. drain waits for the
// first result of every add: an add whose call was overwritten hears at
// once, and the call that overwrote it only when it has run, so when every
// add has heard, every call has run. (A call overwritten while it runs
// hears twice; the buffer of one keeps the first.)
func newE2EAPIDispatcher(r *queuebench.Run) queuebench.E2E {
	schedmetrics.Register() // its metrics exist once registered, as the scheduler does at start (once)
	ad := apidispatcher.New(nil, queuebench.Workers, fwk.APICallRelevances{benchCallType: 0})
	ad.Run(klog.Background())
	fin := make([]chan error, r.Adds())
	return queuebench.E2E{
		Add: func(key string, i, _ int) {
			ch := make(chan error, 1)
			fin[i] = ch
			if err := ad.Add(&kubeCall{r: r, key: key}, fwk.APICallOptions{OnFinish: ch}); err != nil {
				panic(err)
			}
		},
		Drain: func() {
			for _, ch := range fin {
				<-ch
			}
			ad.Close()
		},
	}
}
