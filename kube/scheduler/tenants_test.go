package scheduler

import (
	"context"
	"maps"
	"slices"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/coalescer/dispatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// plainCall is an fwk.APICall that does nothing and allocates nothing of
// its own, so that what a test counts is the dispatcher's.
type plainCall struct {
	typ fwk.APICallType
	uid types.UID
}

func (c *plainCall) CallType() fwk.APICallType                          { return c.typ }
func (c *plainCall) UID() types.UID                                     { return c.uid }
func (c *plainCall) Execute(context.Context, clientset.Interface) error { return nil }
func (c *plainCall) Merge(fwk.APICall) error                            { return nil }
func (c *plainCall) Sync(obj metav1.Object) (metav1.Object, error)      { return obj, nil }
func (c *plainCall) IsNoOp() bool                                       { return false }

// Every call type the adapter knows of is a tenant the core keeps while it
// has no call; a plugin's type that nothing names is an unnamed tenant,
// forgotten when its last call ends.
func TestCallTypeTenantsKept(t *testing.T) {
	const (
		byPriority fwk.APICallType = "by_priority"
		byTimeout  fwk.APICallType = "by_timeout"
		byTenants  fwk.APICallType = "by_tenants"
	)
	d := newTestDispatcher(t, Options{
		Priorities: map[fwk.APICallType]int{byPriority: 5},
		Timeouts:   map[fwk.APICallType]time.Duration{byTimeout: time.Minute},
		Tenants: map[fwk.APICallType]dispatch.TenantConfig{
			byTenants:      {MaxQueued: 7},
			podStatusPatch: {Weight: 3},
		},
	})
	want := []string{
		string(byPriority), string(byTenants), string(byTimeout), "high", "low", "peer",
		string(podBinding), string(podStatusPatch),
	}
	slices.Sort(want)
	named := func() []string {
		ts := d.Stats().Tenants
		delete(ts, "") // the tenant of no name, always kept
		return slices.Sorted(maps.Keys(ts))
	}
	assert.Equal(t, want, named(), "tenants before any call")

	kinds := []fwk.APICallType{typeOther, podBinding, podStatusPatch, typeLow, byPriority, byTimeout, byTenants}
	for _, typ := range kinds {
		fin := make(chan error, 1)
		require.NoError(t, d.Add(&plainCall{typ: typ, uid: types.UID("pod-" + typ)}, fwk.APICallOptions{OnFinish: fin}))
		require.NoError(t, outcome(t, fin))
	}
	require.Eventually(t, func() bool { return d.Stats().Live == 0 }, 10*time.Second, time.Millisecond)
	s := d.Stats()
	assert.Equal(t, want, named(), "tenants after every call ended: the named kept, %q forgotten", typeOther)
	for _, typ := range kinds[1:] {
		assert.Equal(t, uint64(1), s.Tenants[string(typ)].Admitted, "%s's tenant kept its count", typ)
	}
}

// callAllocs is the allocations of one call of type typ, Add to OnFinish to
// the dispatcher idle again, on a started Dispatcher with no call before
// it: everything the call made, in Add, on the worker and in the outcome's
// delivery. synctest.Wait is the only wait, so the count is exact.
func callAllocs(t *testing.T, typ fwk.APICallType) float64 {
	var allocs float64
	client := fake.NewClientset()
	synctest.Test(t, func(t *testing.T) {
		d, err := New(client, testRelevances, Options{})
		require.NoError(t, err)
		d.Start(klog.Background())
		calls := make([]plainCall, 200)
		for i := range calls {
			calls[i] = plainCall{typ: typ, uid: "pod"}
		}
		fin := make(chan error, 1)
		i := 0
		run := func() {
			if err := d.Add(&calls[i], fwk.APICallOptions{OnFinish: fin}); err != nil {
				t.Error(err)
			}
			i++
			if err := <-fin; err != nil {
				t.Error(err)
			}
			synctest.Wait() // the worker done with the call
		}
		run() // the first call makes what later ones reuse
		allocs = testing.AllocsPerRun(len(calls)-2, run)
		require.NoError(t, d.Close(context.Background()))
	})
	return allocs
}

// A call type's tenant is kept between calls: a call of kube-scheduler's
// types, or of one its relevance table names, allocates no more than
// before its type was ever idle, and fewer than one of a plugin's type that
// nothing names, whose tenant the core makes again for each call.
// callAllocsMax is what callAllocs measures for a call of a named type: 2
// (the entry that carries the call and holds its first execution's
// context, with its logger and account, and the core's context that one
// wraps), against 13 for a type whose tenant is made again for it. The
// core's event for the adapter's log observer and the completion hook cost
// nothing.
const callAllocsMax = 2

func TestCallTypeTenantAllocs(t *testing.T) {
	named := map[fwk.APICallType]float64{}
	for _, typ := range []fwk.APICallType{podBinding, podStatusPatch, typeLow} {
		named[typ] = callAllocs(t, typ)
	}
	unnamed := callAllocs(t, typeOther)
	t.Logf("allocations per call, the dispatcher idle between calls: %v; unnamed type %q: %v", named, typeOther, unnamed)
	for typ, n := range named {
		assert.LessOrEqual(t, n, float64(callAllocsMax), "allocations per %s call", typ)
		assert.Greater(t, unnamed, n, "an unnamed type's call makes its tenant again (%s)", typ)
	}
}

// TestEntryFitsItsClass: the entry an Add allocates, its first
// execution's context included, stays within the allocator's 112-byte
// size class, as entry.seen's comment says: one word more would put every
// call in the 128-byte class, what the entry and a context of its own
// took together.
func TestEntryFitsItsClass(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(entry{}), uintptr(112))
}
