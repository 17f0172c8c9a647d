package writer_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// A Classify or OnDone that blocks holds Close past its ctx until it
// returns, as the package documentation says.
func TestBlockedHookHoldsClosePastItsContext(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	text := strings.Join(strings.Fields(strings.ReplaceAll(string(doc), "\n//", "\n")), " ")
	require.Contains(t, text, "Options.Classify, Options.OnDone and the Observer are the dispatcher's callbacks, run on its goroutines with no deadline of their own: a panic in one is contained (Classify's fails its write), but one that blocks holds its worker, and Close, past Close's ctx, until it returns.")
	for _, hook := range []string{"OnDone", "Classify"} {
		t.Run(hook, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, deployment("a"))
				release := make(chan struct{})
				var o writer.Options[deploy]
				if hook == "OnDone" {
					o.OnDone = func(writer.Result[deploy]) { <-release }
				} else {
					o.Classify = func(error) dispatch.Class { <-release; return dispatch.ClassPermanent }
					e.api.Fail(fakeapi.Fault{Key: "update/status", Err: apierrors.NewBadRequest("refused")})
				}
				w, err := writer.New(e.c, o)
				require.NoError(t, err)
				require.NoError(t, w.Set(e.get(t, "a"), status(replicas(1)), writer.SetOptions{}))
				synctest.Wait() // the hook blocks
				closed := make(chan error, 1)
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					closed <- w.Close(ctx)
				}()
				time.Sleep(time.Minute)
				synctest.Wait()
				select {
				case err := <-closed:
					t.Fatalf("Close returned while %s blocked: %v", hook, err)
				default:
				}
				close(release)
				select {
				case <-closed:
				case <-time.After(time.Second):
					t.Fatalf("Close did not return once %s did", hook)
				}
				assert.False(t, w.Busy(e.get(t, "a").UID))
			})
		})
	}
}
