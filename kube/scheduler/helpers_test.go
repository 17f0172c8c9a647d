package scheduler

import (
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	fwk "k8s.io/kube-scheduler/framework"
)

// Call types of the test calls, with the relevances of testRelevances.
const (
	typeLow   fwk.APICallType = "low"
	typeHigh  fwk.APICallType = "high"
	typePeer  fwk.APICallType = "peer" // another type at low's relevance
	typeOther fwk.APICallType = "other"
)

var testRelevances = fwk.APICallRelevances{typeLow: 1, typePeer: 1, typeHigh: 2}

// journal records, in one order, what the dispatcher asked of test calls.
type journal struct {
	mu     sync.Mutex
	events []string
}

func (j *journal) add(ev string) {
	j.mu.Lock()
	j.events = append(j.events, ev)
	j.mu.Unlock()
}

func (j *journal) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.events)
}

// only returns the events that start with prefix, in order.
func (j *journal) only(prefix string) []string {
	var out []string
	for _, ev := range j.list() {
		if len(ev) >= len(prefix) && ev[:len(prefix)] == prefix {
			out = append(out, ev)
		}
	}
	return out
}

// testCall is an fwk.APICall whose behaviour a test sets: it carries a
// set of "fields" (as a status patch carries conditions) and is a no-op
// when its object already has them all. Merge takes the old call's fields
// that the new one lacks, as upstream's PodStatusPatchCall does.
type testCall struct {
	name string
	typ  fwk.APICallType
	uid  types.UID
	j    *journal

	mu     sync.Mutex
	fields []string // what it sets
	have   []string // what the object has, as last synced
	noop   *bool    // if set, IsNoOp's answer, whatever the fields

	exec     func(ctx context.Context, c *testCall) error // nil: succeed
	mergeErr error
}

func newCall(j *journal, name string, typ fwk.APICallType, uid types.UID, fields ...string) *testCall {
	return &testCall{name: name, typ: typ, uid: uid, j: j, fields: fields}
}

func (c *testCall) CallType() fwk.APICallType { return c.typ }
func (c *testCall) UID() types.UID            { return c.uid }

func (c *testCall) Execute(ctx context.Context, _ clientset.Interface) error {
	c.j.add("execute " + c.name)
	if c.exec != nil {
		return c.exec(ctx, c)
	}
	return nil
}

func (c *testCall) Merge(old fwk.APICall) error {
	o := old.(*testCall)
	c.j.add("merge " + c.name + "<-" + o.name)
	if c.mergeErr != nil {
		return c.mergeErr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, f := range o.fields {
		if !slices.Contains(c.fields, f) {
			c.fields = append(c.fields, f)
		}
	}
	return nil
}

// Sync adopts the object's "fields" (its labels' keys) and returns it with
// the call's fields added.
func (c *testCall) Sync(obj metav1.Object) (metav1.Object, error) {
	c.j.add("sync " + c.name)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.have = c.have[:0]
	for k := range obj.GetLabels() {
		c.have = append(c.have, k)
	}
	out := obj.(*metav1.ObjectMeta).DeepCopy()
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	for _, f := range c.fields {
		out.Labels[f] = c.name
	}
	return out, nil
}

func (c *testCall) IsNoOp() bool {
	c.j.add("noop? " + c.name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.noop != nil {
		return *c.noop
	}
	for _, f := range c.fields {
		if !slices.Contains(c.have, f) {
			return false
		}
	}
	return true
}

func (c *testCall) fieldList() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.fields)
}

func ptr[T any](v T) *T { return &v }

func typeUID(s string) types.UID { return types.UID(s) }

func testLogger(t *testing.T) klog.Logger {
	logger, _ := ktesting.NewTestContext(t)
	return logger
}

// newTestDispatcher returns a started Dispatcher on a fake clientset,
// closed when the test ends.
func newTestDispatcher(t *testing.T, o Options) *Dispatcher {
	t.Helper()
	d := newIdleDispatcher(t, o)
	logger, _ := ktesting.NewTestContext(t)
	d.Start(logger)
	return d
}

// newIdleDispatcher is newTestDispatcher before Start.
func newIdleDispatcher(t *testing.T, o Options) *Dispatcher {
	t.Helper()
	d, err := New(fake.NewClientset(), testRelevances, o)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close(canceled()) })
	return d
}

// canceled returns a context that is already done: Close then ends what
// is queued at once, as upstream's Close does.
func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// outcome waits for the one value a call's OnFinish gets.
func outcome(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome on OnFinish within 10s")
		return nil
	}
}

// requireNoMore fails if ch has another value.
func requireNoMore(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("a second outcome on OnFinish: %v", err)
	default:
	}
}

// holder lets a test hold executions: each execution that reaches it waits
// until the test releases one.
type holder struct {
	arrived chan string
	release chan struct{}
}

func newHolder() *holder {
	return &holder{arrived: make(chan string, 1000), release: make(chan struct{}, 1000)}
}

func (g *holder) exec(ctx context.Context, c *testCall) error {
	g.arrived <- c.name
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

var errTest = errors.New("test error")

// errRetryable is an error kube.Classify retries.
var errRetryable = apierrors.NewServiceUnavailable("test")

// total sums a Stats count by state.
func total(byState map[dispatch.State]uint64) uint64 {
	var n uint64
	for _, c := range byState {
		n += c
	}
	return n
}

// fileDoc returns the Go file name's text with its comment markers dropped
// and its white space collapsed, so that a sentence of a doc comment reads
// as one line.
func fileDoc(t *testing.T, name string) string {
	t.Helper()
	src, err := os.ReadFile(name)
	require.NoError(t, err)
	return strings.Join(strings.Fields(regexp.MustCompile(`\n\s*//`).ReplaceAllString(string(src), "\n")), " ")
}
