package writer_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/test/integration/apiserver"
)

// U is the type the writer writes here: the test resource, through the
// dynamic client.
type U = unstructured.Unstructured

// The test resource: a namespaced Widget with a status subresource.
const (
	group = "dispatch.example.com"
	kind  = "Widget"
)

var widgets = schema.GroupVersionResource{Group: group, Version: "v1", Resource: "widgets"}

// callTimeout bounds every wait for an outcome: a desire that has not ended
// by then is a bug (a retry loop, a lost outcome), not a slow machine.
const callTimeout = 60 * time.Second

// stack is a real kube-apiserver with RBAC authorization and the Widget
// resource installed.
type stack struct {
	*apiserver.Server
	// admin is a dynamic client as the loopback superuser, direct to the
	// apiserver: setup, the "other writer", and checks.
	admin dynamic.Interface
}

// startStack starts a server that authorizes with RBAC alone, so that a
// service account can do only what its roles grant, and installs the
// Widget resource.
func startStack(t testing.TB) *stack {
	t.Helper()
	s := apiserver.Start(t, apiserver.WithFlags("--authorization-mode=RBAC"))
	installCRD(t, s.AdminConfig)
	admin, err := dynamic.NewForConfig(s.AdminConfig)
	require.NoError(t, err)
	st := &stack{Server: s, admin: admin}
	// The resource is served once its discovery and storage are up.
	require.Eventually(t, func() bool {
		_, err := admin.Resource(widgets).List(context.Background(), metav1.ListOptions{Limit: 1})
		return err == nil
	}, callTimeout, 20*time.Millisecond, "widgets are not served")
	return st
}

// installCRD creates the Widget CustomResourceDefinition, with a status
// subresource and a schema naming the fields the tests write, and waits
// until it is established.
func installCRD(t testing.TB, cfg *rest.Config) {
	t.Helper()
	c, err := apiextensions.NewForConfig(cfg)
	require.NoError(t, err)
	preserve := true
	object := func(fields map[string]apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "object", Properties: fields, XPreserveUnknownFields: &preserve}
	}
	integer := apiextensionsv1.JSONSchemaProps{Type: "integer"}
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: widgets.Resource + "." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: widgets.Resource, Singular: "widget", Kind: kind, ListKind: kind + "List",
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: widgets.Version, Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{
					Status: &apiextensionsv1.CustomResourceSubresourceStatus{},
				},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": object(map[string]apiextensionsv1.JSONSchemaProps{"size": integer}),
						"status": object(map[string]apiextensionsv1.JSONSchemaProps{
							"phase": str, "observed": integer, "other": integer, "count": integer, "ready": str,
						}),
					},
				}},
			}},
		},
	}
	_, err = c.ApiextensionsV1().CustomResourceDefinitions().Create(t.Context(), crd, metav1.CreateOptions{})
	require.NoError(t, err, "create the Widget CRD")
	require.Eventually(t, func() bool {
		got, err := c.ApiextensionsV1().CustomResourceDefinitions().Get(context.Background(), crd.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true
			}
		}
		return false
	}, callTimeout, 20*time.Millisecond, "the Widget CRD is not established")
}

// namespace creates a namespace named name.
func (st *stack) namespace(t testing.TB, name string) string {
	t.Helper()
	_, err := st.AdminClient.CoreV1().Namespaces().Create(t.Context(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return name
}

// controller returns a config, through the proxy, for a service account of
// ns that holds what a Widget controller holds and nothing more: get, list
// and watch on widgets, update and patch on widgets/status. Its token is a
// real one, from the TokenRequest API; it has no client-side rate limit
// (QPS -1), so that the writer's own limiter is the only one.
func (st *stack) controller(t testing.TB, ns string) *rest.Config {
	t.Helper()
	ctx := t.Context()
	const name = "widget-controller"
	cs := st.AdminClient
	_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{group}, Resources: []string{widgets.Resource}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{group}, Resources: []string{widgets.Resource + "/status"}, Verbs: []string{"update", "patch"}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	expiry := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := st.Proxy.ClientConfig(&rest.Config{BearerToken: tr.Status.Token, QPS: -1, UserAgent: name})

	// The authorizer sees the binding once its informer has it.
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := dyn.Resource(widgets).Namespace(ns).List(context.Background(), metav1.ListOptions{Limit: 1})
		return err == nil
	}, callTimeout, 20*time.Millisecond, "the service account cannot list widgets")
	// And it can do no more than that: a controller's RBAC.
	_, err = dyn.Resource(widgets).Namespace(ns).Create(ctx, newWidget("forbidden"), metav1.CreateOptions{})
	require.Error(t, err, "the service account may create widgets: its RBAC is not a controller's")
	return cfg
}

func newWidget(name string) *U {
	u := &U{}
	u.SetAPIVersion(group + "/v1")
	u.SetKind(kind)
	u.SetName(name)
	_ = unstructured.SetNestedField(u.Object, int64(1), "spec", "size")
	return u
}

// createWidgets creates n widgets named prefix-0 … prefix-(n-1) in ns, as the
// admin, a few at a time, and returns them as the server answered: with UID
// and resourceVersion, as an informer would show them.
func (st *stack) createWidgets(t testing.TB, ns, prefix string, n int) []*U {
	t.Helper()
	out := make([]*U, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	const parallel = 16
	for p := range parallel {
		wg.Go(func() {
			for i := p; i < n; i += parallel {
				out[i], errs[i] = st.admin.Resource(widgets).Namespace(ns).Create(context.Background(),
					newWidget(fmt.Sprintf("%s-%d", prefix, i)), metav1.CreateOptions{})
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "create widget %s-%d", prefix, i)
	}
	return out
}

// get reads a widget as the admin.
func (st *stack) get(t testing.TB, ns, name string) *U {
	t.Helper()
	u, err := st.admin.Resource(widgets).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return u
}

// list reads every widget of ns as the admin, by name.
func (st *stack) list(t testing.TB, ns string) map[string]*U {
	t.Helper()
	l, err := st.admin.Resource(widgets).Namespace(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	out := make(map[string]*U, len(l.Items))
	for i := range l.Items {
		out[l.Items[i].GetName()] = &l.Items[i]
	}
	return out
}

// newWriter returns a writer for widgets that sends through cfg as the
// writer's client is meant to be built (writer.RESTConfig), and closes it
// when the test ends.
func newWriter(t testing.TB, cfg *rest.Config, o writer.Options[*U]) *writer.Writer[*U] {
	t.Helper()
	dyn, err := dynamic.NewForConfig(writer.RESTConfig(cfg))
	require.NoError(t, err)
	w, err := writer.New(writer.Dynamic(dyn.Resource(widgets)), o)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_ = w.Close(ctx)
	})
	return w
}

// wait returns the desire's outcome, failing the test if it takes longer
// than callTimeout.
func wait(t testing.TB, tk *writer.Ticket[*U]) writer.Result[*U] {
	t.Helper()
	return waitUntil(t, tk, time.Now().Add(callTimeout))
}

// waitUntil returns the desire's outcome, failing the test if it has none
// by deadline.
func waitUntil(t testing.TB, tk *writer.Ticket[*U], deadline time.Time) writer.Result[*U] {
	t.Helper()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	res, err := tk.Wait(ctx)
	if ctx.Err() != nil {
		t.Fatalf("no outcome by %v: %v", deadline.Format(time.TimeOnly), err)
	}
	return res
}

// statusOf returns a widget's status field, or nil.
func statusOf(u *U, field string) any {
	v, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "status", field)
	if !ok {
		return nil
	}
	return v
}

// setStatus returns the change that sets status fields, leaving the rest.
func setStatus(fields map[string]any) writer.Change[*U] {
	return func(o *U) error {
		for k, v := range fields {
			if err := unstructured.SetNestedField(o.Object, v, "status", k); err != nil {
				return err
			}
		}
		return nil
	}
}

// isStatusWrite matches a write to a widget's status subresource in ns.
func isStatusWrite(ns string) apiserver.Match {
	return func(r apiserver.Request) bool {
		return r.IsWrite() && r.Resource == widgets.Resource && r.Subresource == "status" && r.Namespace == ns
	}
}

// isRead matches a read of a single widget in ns.
func isRead(ns string) apiserver.Match {
	return func(r apiserver.Request) bool {
		return r.Method == http.MethodGet && r.Resource == widgets.Resource && r.Name != "" && r.Namespace == ns
	}
}

// events counts, per widget name, the watch events of ns after it
// started: every write the server accepted that changed an object makes
// one MODIFIED event; a write that changed nothing makes none.
type events struct {
	mu       sync.Mutex
	modified map[string]int
	seen     map[string]chan struct{} // names whose ADDED event is awaited
}

// watch starts counting the events of ns's widgets from now, until the
// test ends.
func (st *stack) watch(t testing.TB, ns string) *events {
	t.Helper()
	l, err := st.admin.Resource(widgets).Namespace(ns).List(t.Context(), metav1.ListOptions{Limit: 1})
	require.NoError(t, err)
	wi, err := st.admin.Resource(widgets).Namespace(ns).Watch(context.Background(),
		metav1.ListOptions{ResourceVersion: l.GetResourceVersion()})
	require.NoError(t, err)
	e := &events{modified: map[string]int{}, seen: map[string]chan struct{}{}}
	var done sync.WaitGroup
	done.Go(func() {
		for ev := range wi.ResultChan() {
			u, ok := ev.Object.(*U)
			if !ok {
				continue
			}
			e.mu.Lock()
			switch ev.Type {
			case watch.Modified:
				e.modified[u.GetName()]++
			case watch.Added:
				if ch, ok := e.seen[u.GetName()]; ok {
					close(ch)
					delete(e.seen, u.GetName())
				}
			}
			e.mu.Unlock()
		}
	})
	t.Cleanup(func() { wi.Stop(); done.Wait() })
	return e
}

// sync creates a marker widget and waits until the watch has seen it: by
// then it has seen every event before it (a watch is ordered by
// resourceVersion).
func (e *events) sync(t testing.TB, st *stack, ns string) {
	t.Helper()
	name := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	ch := make(chan struct{})
	e.mu.Lock()
	e.seen[name] = ch
	e.mu.Unlock()
	_, err := st.admin.Resource(widgets).Namespace(ns).Create(t.Context(), newWidget(name), metav1.CreateOptions{})
	require.NoError(t, err)
	select {
	case <-ch:
	case <-time.After(callTimeout):
		t.Fatalf("the watch of %s did not see %s within %v", ns, name, callTimeout)
	}
}

func (e *events) count(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.modified[name]
}
