package scheduler

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

type ctxKey struct{}

// seeCall reports what its Execute's context carries, then waits for the
// context to end if block is set.
type seeCall struct {
	plainCall
	block bool
	saw   chan context.Context
}

func (c *seeCall) Execute(ctx context.Context, _ clientset.Interface) error {
	c.saw <- ctx
	if !c.block {
		return nil
	}
	<-ctx.Done()
	return context.Cause(ctx)
}

// Execute's context carries the logger Start was given (klog.FromContext),
// the meter's account, the values of the context the core gives an
// execution, and the core's cancellation: a Close whose context has ended
// ends the execution's.
func TestExecuteContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recordSink{}
		d, err := New(fake.NewClientset(), testRelevances, Options{})
		require.NoError(t, err)
		d.Start(logr.New(sink))

		c := &seeCall{plainCall: plainCall{typ: podBinding, uid: types.UID("pod-1")}, block: true, saw: make(chan context.Context, 1)}
		fin := make(chan error, 1)
		require.NoError(t, d.Add(c, fwk.APICallOptions{OnFinish: fin}))
		ctx := <-c.saw

		klog.FromContext(ctx).Info("from Execute")
		assert.Contains(t, sink.messages(), "from Execute", "the logger Start was given")
		a, ok := ctx.Value(attemptKey{}).(*attempt)
		require.True(t, ok, "the meter's account")
		assert.Zero(t, a.retryAfter.Load())
		assert.Nil(t, ctx.Value(ctxKey{}), "a key nobody set")
		derived, cancel := context.WithTimeout(context.WithValue(ctx, ctxKey{}, "v"), time.Hour)
		defer cancel()
		assert.Equal(t, "v", derived.Value(ctxKey{}))
		assert.Same(t, a, derived.Value(attemptKey{}), "a request's context, derived from Execute's, finds the account")

		now, stop := context.WithCancel(context.Background())
		stop()
		closed := make(chan error, 1)
		go func() { closed <- d.Close(now) }()
		<-derived.Done() // a deadlock here fails the test: nothing ended it
		assert.Error(t, context.Cause(ctx), "the core's cause")
		assert.False(t, errors.Is(context.Cause(derived), context.DeadlineExceeded), "ended by Close, not the derived deadline")
		assert.Error(t, <-fin, "the call's outcome")
		<-closed
	})
}

// recordSink is a logr sink that records messages.
type recordSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *recordSink) messages() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

func (s *recordSink) Init(logr.RuntimeInfo) {}
func (s *recordSink) Enabled(int) bool      { return true }
func (s *recordSink) Info(_ int, msg string, _ ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, msg)
}
func (s *recordSink) Error(error, string, ...any)    {}
func (s *recordSink) WithValues(...any) logr.LogSink { return s }
func (s *recordSink) WithName(string) logr.LogSink   { return s }

// Every execution gets a context of its own, never reused: the first
// one's lives in the entry, a retry's is new, and a context the first
// execution handed on stays done, with its own account, while the retry
// runs. Both carry the logger and an account of their own.
func TestExecuteContextPerExecution(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &recordSink{}
		d, err := New(fake.NewClientset(), testRelevances, Options{})
		require.NoError(t, err)
		d.Start(logr.New(sink))
		t.Cleanup(func() { require.NoError(t, d.Close(t.Context())) })

		j := &journal{}
		c := newCall(j, "a", podStatusPatch, "1", "x")
		var ctxs []context.Context
		c.exec = func(ctx context.Context, _ *testCall) error {
			ctxs = append(ctxs, ctx) // executions of one call run one at a time
			klog.FromContext(ctx).Info("execution", "n", len(ctxs))
			if len(ctxs) == 1 {
				ctx.Value(attemptKey{}).(*attempt).retryAfter.Store(int64(time.Second))
				return apierrors.NewServiceUnavailable("busy")
			}
			assert.Error(t, ctxs[0].Err(), "the first execution's context stays done while the retry runs")
			assert.NoError(t, ctx.Err())
			return nil
		}
		tk, err := d.Submit(c, fwk.APICallOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		require.NoError(t, res.Err)
		require.Len(t, ctxs, 2)
		assert.Equal(t, 2, res.Outcome.Attempts)

		assert.NotSame(t, ctxs[0], ctxs[1], "a context of its own for the retry")
		first, ok := ctxs[0].(*execCtx)
		require.True(t, ok)
		a0 := ctxs[0].Value(attemptKey{}).(*attempt)
		a1 := ctxs[1].Value(attemptKey{}).(*attempt)
		assert.Same(t, &first.attempt, a0)
		assert.NotSame(t, a0, a1, "an account of its own for each execution")
		assert.Equal(t, int64(time.Second), a0.retryAfter.Load(), "the first's account, untouched by the retry")
		assert.Zero(t, a1.retryAfter.Load())
		assert.Error(t, ctxs[0].Err())
		assert.Error(t, ctxs[1].Err(), "each ended with its execution")
		n := 0
		for _, m := range sink.messages() {
			if m == "execution" {
				n++
			}
		}
		assert.Equal(t, 2, n, "each execution's line, on Start's logger")
	})
}

// execCtxFor hands an entry's first execution the context the entry holds
// and each later one a new one, leaving the first's bound to its own
// execution; before Start, the logger is klog's.
func TestExecCtxFor(t *testing.T) {
	d, err := New(fake.NewClientset(), testRelevances, Options{})
	require.NoError(t, err)
	e := newEntry(newCall(&journal{}, "a", podBinding, "1"), nil)
	ctx1, cancel1 := context.WithCancel(context.Background())
	cancel1()
	a1 := d.execCtxFor(ctx1, e)
	assert.Same(t, &e.first, a1, "the first execution's context is the entry's")
	assert.True(t, e.is(aRan))
	a2 := d.execCtxFor(context.Background(), e)
	assert.NotSame(t, a1, a2, "a retry's is its own")
	assert.Error(t, a1.Err(), "the first stays bound to its execution's context")
	assert.NoError(t, a2.Err())
	require.NotNil(t, a1.logs, "before Start, a context holding klog's logger")
	assert.NotPanics(t, func() { klog.FromContext(a1).Info("before Start") })
	assert.False(t, a1.prepaid.Load(), "a fake clientset is not metered")
}
