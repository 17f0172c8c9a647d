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
