package writer_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// identity returns the object of name as an identity alone (no
// resourceVersion): Set cannot judge it, so its change runs first on a
// worker, after a read.
func (e *env) identity(t *testing.T, name string) deploy {
	d := e.get(t, name)
	d.ResourceVersion = ""
	return d
}

// Whatever a change does, its desire ends exactly once, the object's lane
// takes the next desire, and Close returns.
func TestChangeMisbehaving(t *testing.T) {
	cases := map[string]struct {
		change func(release <-chan struct{}) writer.Change[deploy]
		check  func(t *testing.T, res writer.Result[deploy], err error)
	}{
		"panics": {
			change: func(<-chan struct{}) writer.Change[deploy] { return func(deploy) error { panic("boom") } },
			check: func(t *testing.T, res writer.Result[deploy], err error) {
				var pe *dispatch.PanicError
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, "change", pe.Callback)
				assert.Equal(t, "boom", pe.Value)
				assert.Equal(t, dispatch.StateFailed, res.State)
				assert.Equal(t, 1, res.Attempts, "never retried")
			},
		},
		"exits its goroutine": {
			change: func(<-chan struct{}) writer.Change[deploy] {
				return func(deploy) error { runtime.Goexit(); return nil }
			},
			check: func(t *testing.T, _ writer.Result[deploy], err error) {
				var pe *dispatch.PanicError
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, dispatch.ErrGoexit, pe.Value)
			},
		},
		"fails": {
			change: func(<-chan struct{}) writer.Change[deploy] {
				return func(deploy) error { return errors.New("cannot compute") }
			},
			check: func(t *testing.T, res writer.Result[deploy], err error) {
				assert.ErrorContains(t, err, "cannot compute")
				assert.Equal(t, 1, res.Attempts)
			},
		},
		"blocks": {
			change: func(release <-chan struct{}) writer.Change[deploy] {
				return func(deploy) error { <-release; return nil }
			},
			check: func(t *testing.T, res writer.Result[deploy], err error) {
				require.ErrorIs(t, err, dispatch.ErrExpired)
				assert.Equal(t, dispatch.StateExpired, res.State)
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				release := make(chan struct{})
				defer close(release)
				w, err := writer.New(e.c, writer.Options[deploy]{})
				require.NoError(t, err)
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()

				tk, err := w.Submit(ctx, e.identity(t, "a"), status(tc.change(release)), writer.SetOptions{})
				require.NoError(t, err)
				res, err := tk.Wait(t.Context())
				tc.check(t, res, err)

				// The lane is free: the next desire is written.
				tk, err = w.Submit(t.Context(), e.get(t, "a"), status(replicas(7)), writer.SetOptions{})
				require.NoError(t, err)
				res, err = tk.Wait(t.Context())
				require.NoError(t, err)
				assert.Equal(t, int32(7), res.Object.Status.Replicas)

				closeCtx, stop := context.WithTimeout(t.Context(), time.Second)
				defer stop()
				require.NoError(t, w.Close(closeCtx))
			})
		})
	}
}

// A change that panics where Set tests it, on the caller's goroutine, does
// not reach the caller: the desire is queued, and fails on a worker.
func TestChangePanicsInSet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{})
		tk, err := w.Submit(t.Context(), e.get(t, "a"), status(func(deploy) error { panic("boom") }), writer.SetOptions{})
		require.NoError(t, err)
		_, err = tk.Wait(t.Context())
		var pe *dispatch.PanicError
		require.ErrorAs(t, err, &pe)
	})
}

// A change blocked in the dispatcher's no-op test, which has no context
// of its own, does not hang Close.
func TestBlockedChangeDoesNotHangClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		release, held := make(chan struct{}), make(chan struct{})
		defer close(release)
		var once sync.Once
		e.api.Before(func(fakeapi.Request) { once.Do(func() { <-held }) })
		w, err := writer.New(e.c, writer.Options[deploy]{})
		require.NoError(t, err)
		a := e.get(t, "a")
		require.NoError(t, w.Set(a, status(replicas(1)), writer.SetOptions{}))
		synctest.Wait() // in flight, held
		require.NoError(t, w.Set(a, status(func(deploy) error { <-release; return nil }), writer.SetOptions{}))
		close(held) // the first lands; its successor's change blocks
		synctest.Wait()

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		err = w.Close(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, time.Second, time.Since(start))
		assert.Equal(t, int32(1), e.get(t, "a").Status.Replicas)
	})
}

// A change may call the writer: Set for another object, Stats, and Close,
// which then returns ErrReentrant instead of waiting for itself.
func TestChangeCallsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"), deployment("b"))
		w, err := writer.New(e.c, writer.Options[deploy]{})
		require.NoError(t, err)
		b := e.get(t, "b")
		var closeErr error
		change := func(d deploy) error {
			d.Status.Replicas = 1
			if err := w.Set(b, status(replicas(2)), writer.SetOptions{}); err != nil && !errors.Is(err, dispatch.ErrClosed) {
				return err
			}
			_ = w.Stats()
			if closeErr == nil {
				closeErr = w.Close(context.Background())
			}
			return nil
		}
		tk, err := w.Submit(t.Context(), e.identity(t, "a"), status(change), writer.SetOptions{})
		require.NoError(t, err)
		res, err := tk.Wait(t.Context())
		require.NoError(t, err)
		assert.Equal(t, int32(1), res.Object.Status.Replicas)
		require.ErrorIs(t, closeErr, dispatch.ErrReentrant)
		require.NoError(t, w.Close(t.Context()))
		assert.Equal(t, int32(2), e.get(t, "b").Status.Replicas, "queued before Close: drained")
	})
}

// Options.Merge runs where changes run, never under the dispatcher's lock:
// a merge that panics fails its write; one that blocks holds only it.
func TestMergeMisbehaving(t *testing.T) {
	for _, block := range []bool{false, true} {
		name := map[bool]string{false: "panics", true: "blocks"}[block]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				release := make(chan struct{})
				defer close(release)
				held := make(chan struct{})
				e.api.Before(func(r fakeapi.Request) {
					if r.Name == "a" {
						<-held
					}
				})
				w := newWriter(t, e, writer.Options[deploy]{Merge: func(p, i writer.Change[deploy]) writer.Change[deploy] {
					if block {
						<-release
					}
					panic("merge")
				}})
				a := e.get(t, "a")
				require.NoError(t, w.Set(a, status(replicas(1)), writer.SetOptions{}))
				synctest.Wait() // in flight, held
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()
				t1, err := w.Submit(ctx, a, status(replicas(2)), writer.SetOptions{})
				require.NoError(t, err)
				t2, err := w.Submit(ctx, a, status(replicas(3)), writer.SetOptions{})
				require.NoError(t, err, "merged without running Merge")
				assert.True(t, w.Busy(a.UID))
				close(held)
				r1, _ := t1.Wait(t.Context())
				r2, _ := t2.Wait(t.Context())
				assert.Equal(t, r1.State, r2.State, "one write, one outcome")
				if block {
					assert.Equal(t, dispatch.StateExpired, r1.State)
				} else {
					assert.Equal(t, dispatch.StateFailed, r1.State)
					var pe *dispatch.PanicError
					assert.ErrorAs(t, r1.Err, &pe)
				}
			})
		})
	}
}

func TestOnDonePanicIsContained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deployment("a"))
		w := newWriter(t, e, writer.Options[deploy]{OnDone: func(writer.Result[deploy]) { panic("hook") }})
		require.NoError(t, w.Set(e.get(t, "a"), status(replicas(1)), writer.SetOptions{}))
		settle(t, w)
		assert.Equal(t, uint64(1), w.Stats().Dispatch.CallbackPanics)
		assert.Equal(t, int32(1), e.get(t, "a").Status.Replicas)
	})
}
