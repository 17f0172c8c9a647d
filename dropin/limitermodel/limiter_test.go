package apidispatcher

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	apicalls "k8s.io/kubernetes/pkg/scheduler/framework/api_calls"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pod(name string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)}}
}

var unschedulable = &v1.PodCondition{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable}

// TestFromFailureHandler: what the limiter holds, on upstream's own call
// types — the failure handler's patch, with or without a nomination it
// does not make; and what it lets through.
func TestFromFailureHandler(t *testing.T) {
	for _, tc := range []struct {
		name string
		call fwk.APICall
		held bool
	}{
		{"failure handler's condition", apicalls.Implementations.PodStatusPatch(pod("a"), []*v1.PodCondition{unschedulable}, nil), true},
		{"condition, no-op nomination", apicalls.Implementations.PodStatusPatch(pod("a"), []*v1.PodCondition{unschedulable}, &fwk.NominatingInfo{NominatingMode: fwk.ModeNoop}), true},
		{"condition and a preemption's nomination", apicalls.Implementations.PodStatusPatch(pod("a"), []*v1.PodCondition{unschedulable}, &fwk.NominatingInfo{NominatingMode: fwk.ModeOverride, NominatedNodeName: "node-1"}), false},
		{"condition clearing a nomination", apicalls.Implementations.PodStatusPatch(pod("a"), []*v1.PodCondition{unschedulable}, &fwk.NominatingInfo{NominatingMode: fwk.ModeOverride}), true},
		{"preemption clearing a nomination, no condition", apicalls.Implementations.PodStatusPatch(pod("a"), nil, &fwk.NominatingInfo{NominatingMode: fwk.ModeOverride}), false},
		{"binding", apicalls.Implementations.PodBinding(&v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "uid-a"}, Target: v1.ObjectReference{Name: "node-1"}}), false},
		{"a plugin's call", otherCall{}, false},
		{"a plugin's call of the status patch's type", otherCall{typ: podStatusPatch}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.held, fromFailureHandler(tc.call))
		})
	}
}

type otherCall struct {
	fwk.APICall
	typ fwk.APICallType
}

func (c otherCall) CallType() fwk.APICallType { return c.typ }

// TestFailureHandlerLimiter: at most DefaultFailureHandlerParallelism
// failure-handler patches hold a slot at once, served in the order they
// came; a binding passes while every slot is held; a context without a
// limiter holds nothing; waiters leave without a slot when the context
// ends.
func TestFailureHandlerLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(withFailureHandlerLimiter(context.Background()))
		var mu sync.Mutex
		granted := make([]time.Time, 10)
		now, most := 0, 0
		var wg sync.WaitGroup
		for i := range 10 {
			wg.Go(func() {
				release := acquireFailureHandlerSlot(ctx, apicalls.Implementations.PodStatusPatch(pod(fmt.Sprint("p", i)), []*v1.PodCondition{unschedulable}, nil))
				mu.Lock()
				granted[i] = time.Now()
				now++
				most = max(most, now)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				mu.Lock()
				now--
				mu.Unlock()
				release()
			})
			synctest.Wait() // each arrives after the one before
		}
		binding := apicalls.Implementations.PodBinding(&v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "b", UID: "uid-b"}, Target: v1.ObjectReference{Name: "node-1"}})
		acquireFailureHandlerSlot(ctx, binding)() // all four held: passes at once
		wg.Wait()
		assert.Equal(t, DefaultFailureHandlerParallelism, most)
		for i := 1; i < len(granted); i++ {
			assert.False(t, granted[i].Before(granted[i-1]), "patch %d got a slot before patch %d, which came first", i, i-1)
		}
		assert.Equal(t, granted[0].Add(20*time.Millisecond), granted[9], "three waves of at most four")

		patch := apicalls.Implementations.PodStatusPatch(pod("x"), []*v1.PodCondition{unschedulable}, nil)
		for range 20 {
			acquireFailureHandlerSlot(context.Background(), patch)() // no limiter: nothing held
		}
		var held []func()
		for range DefaultFailureHandlerParallelism {
			held = append(held, acquireFailureHandlerSlot(ctx, patch))
		}
		left := make(chan struct{})
		go func() {
			acquireFailureHandlerSlot(ctx, patch)()
			close(left)
		}()
		synctest.Wait()
		select {
		case <-left:
			t.Fatal("a fifth patch got past four held slots")
		default:
		}
		cancel()
		<-left
		for _, r := range held {
			r()
		}
	})
}
