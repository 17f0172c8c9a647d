package scheduler_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/coalescer/dispatch/kube"
	"github.com/coalescer/dispatch/kube/scheduler"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// labelCall is a plugin's own fwk.APICall: it sets a label on a pod.
type labelCall struct {
	uid        types.UID
	key, value string
}

func (c *labelCall) CallType() fwk.APICallType { return "example_label" }
func (c *labelCall) UID() types.UID            { return c.uid }
func (c *labelCall) Execute(ctx context.Context, client clientset.Interface) error {
	fmt.Printf("set %s=%s on %s\n", c.key, c.value, c.uid)
	return nil
}
func (c *labelCall) Merge(old fwk.APICall) error                   { return nil }
func (c *labelCall) Sync(obj metav1.Object) (metav1.Object, error) { return obj, nil }
func (c *labelCall) IsNoOp() bool                                  { return false }

// A custom scheduler binary builds the dispatcher with its clientset and
// relevance table, adds calls, and starts it with the scheduler; each
// call's result arrives on its OnFinish channel, exactly once.
func ExampleNew() {
	// kube-scheduler's own table is upstream's api_calls.Relevances.
	relevances := fwk.APICallRelevances{
		fwk.APICallType(kube.PodStatusPatch): 1,
		fwk.APICallType(kube.PodBinding):     2,
		"example_label":                      1,
	}
	d, err := scheduler.New(fake.NewClientset(), relevances, scheduler.Options{})
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background()) // drains what is queued

	// Two calls of the same type for the same pod before anything runs:
	// the second absorbs the first (through its Merge) and replaces it.
	first, second := make(chan error, 1), make(chan error, 1)
	_ = d.Add(&labelCall{uid: "pod-1", key: "team", value: "a"}, fwk.APICallOptions{OnFinish: first})
	_ = d.Add(&labelCall{uid: "pod-1", key: "team", value: "b"}, fwk.APICallOptions{OnFinish: second})
	err = <-first
	fmt.Println("first overwritten:", errors.Is(err, fwk.ErrCallOverwritten))

	d.Start(klog.Background())
	fmt.Println("second:", <-second)
	// Output:
	// first overwritten: true
	// set team=b on pod-1
	// second: <nil>
}
