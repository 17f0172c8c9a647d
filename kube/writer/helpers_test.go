package writer_test

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
)

type deploy = *appsv1.Deployment

var deploymentsGVR = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}

// env is a fake clientset behind fakeapi's server semantics, with the
// writer's typed client for Deployments.
type env struct {
	cs  *fake.Clientset
	api *fakeapi.Server
	c   writer.Client[deploy]
}

func newEnv(t testing.TB, objs ...runtime.Object) *env {
	t.Helper()
	cs := fake.NewSimpleClientset()
	api, err := fakeapi.Install(&cs.Fake, cs.Tracker(), objs...)
	require.NoError(t, err)
	return &env{cs: cs, api: api, c: writer.Typed(func(ns string) writer.TypedClient[deploy] {
		return cs.AppsV1().Deployments(ns)
	})}
}

func deployment(name string) deploy {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
}

func deploymentIn(ns, name string) deploy {
	d := deployment(name)
	d.Namespace = ns
	return d
}

// get reads name from the store, past the server's counters.
func (e *env) get(t *testing.T, name string) deploy {
	t.Helper()
	return e.getIn(t, "default", name)
}

func (e *env) getIn(t *testing.T, ns, name string) deploy {
	t.Helper()
	o, err := e.cs.Tracker().Get(deploymentsGVR, ns, name)
	require.NoError(t, err)
	return o.(deploy)
}

// newWriter returns a writer over e, closed when the test ends.
func newWriter(t *testing.T, e *env, o writer.Options[deploy]) *writer.Writer[deploy] {
	t.Helper()
	w, err := writer.New(e.c, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

// settle waits, in a synctest bubble, until the writer has nothing
// queued, waiting or in flight.
func settle(t *testing.T, w interface{ Stats() writer.Stats }) {
	t.Helper()
	for range 100000 {
		if s := w.Stats().Dispatch; s.Keys == 0 && s.Live == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("writer did not settle: %+v", w.Stats())
}

// condition sets the condition typ to v, keeping its transition time if
// its status stays, as meta.SetStatusCondition does.
func condition(typ string, v corev1.ConditionStatus) writer.Change[deploy] {
	return func(d deploy) error {
		setCondition(d, typ, v, "")
		return nil
	}
}

func setCondition(d deploy, typ string, v corev1.ConditionStatus, reason string) {
	for i := range d.Status.Conditions {
		c := &d.Status.Conditions[i]
		if string(c.Type) == typ {
			if c.Status != v {
				c.LastTransitionTime = metav1.Now()
			}
			c.Status, c.Reason = v, reason
			return
		}
	}
	d.Status.Conditions = append(d.Status.Conditions, appsv1.DeploymentCondition{
		Type: appsv1.DeploymentConditionType(typ), Status: v, Reason: reason, LastTransitionTime: metav1.Now(),
	})
}

func conditionOf(d deploy, typ string) corev1.ConditionStatus {
	for _, c := range d.Status.Conditions {
		if string(c.Type) == typ {
			return c.Status
		}
	}
	return ""
}

// replicas sets the status's replica count.
func replicas(n int32) writer.Change[deploy] {
	return func(d deploy) error {
		d.Status.Replicas = n
		return nil
	}
}

func status(c writer.Change[deploy]) writer.Desire[deploy] { return writer.Desire[deploy]{Status: c} }

// fileDoc returns the Go file name's text with its comment markers dropped
// and its white space collapsed, so that a sentence of a doc comment reads
// as one line.
func fileDoc(t *testing.T, name string) string {
	t.Helper()
	src, err := os.ReadFile(name)
	require.NoError(t, err)
	return strings.Join(strings.Fields(regexp.MustCompile(`\n\s*//`).ReplaceAllString(string(src), "\n")), " ")
}
