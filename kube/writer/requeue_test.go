package writer_test

import (
	"context"
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

// OnDone is there to requeue an object whose write did not land, and a
// controller's work queue is keyed by namespace and name: every Result
// carries them, whatever its outcome — a write refused before anything
// was read (Failed), one Close ended unwritten (Closed), one Forget ended
// (Canceled) — not only those that ran to their end with an object.
func TestOnDoneCanRequeueByNamespaceAndName(t *testing.T) {
	require.Contains(t, fileDoc(t, "ticket.go"), "Namespace and Name are the object's, as given to Set: with them OnDone can requeue it, whatever the outcome (Object is nil for most that did not land).")
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, deploymentIn("ns1", "failed"), deploymentIn("ns2", "closed"), deploymentIn("ns3", "forgotten"))
		e.api.Fail(fakeapi.Fault{Key: "update/status", Times: 1, Err: apierrors.NewBadRequest("refused")})
		got := map[dispatch.State][2]string{}
		w, err := writer.New(e.c, writer.Options[deploy]{Workers: 1, QPS: 1.0 / 60, Burst: 1,
			OnDone: func(r writer.Result[deploy]) { got[r.State] = [2]string{r.Namespace, r.Name} }})
		require.NoError(t, err)
		require.NoError(t, w.Set(e.getIn(t, "ns1", "failed"), status(replicas(1)), writer.SetOptions{}))
		synctest.Wait() // refused: the only token is spent
		forgotten := e.getIn(t, "ns3", "forgotten")
		tk, err := w.Submit(t.Context(), forgotten, status(replicas(1)), writer.SetOptions{})
		require.NoError(t, err)
		require.True(t, w.Forget(forgotten.UID))
		res, _ := tk.Wait(t.Context())
		assert.Equal(t, [2]string{"ns3", "forgotten"}, [2]string{res.Namespace, res.Name}, "the Ticket's Result too")
		require.NoError(t, w.Set(e.getIn(t, "ns2", "closed"), status(replicas(1)), writer.SetOptions{}))
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		require.Error(t, w.Close(ctx))
		assert.Equal(t, map[dispatch.State][2]string{
			dispatch.StateFailed:   {"ns1", "failed"},
			dispatch.StateCanceled: {"ns3", "forgotten"},
			dispatch.StateClosed:   {"ns2", "closed"},
		}, got)
	})
}
