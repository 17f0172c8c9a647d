package differential

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// server is a fake API server for the pods' status patches, label
// patches and bindings: it records each request, holds the next one for a
// pod when told to, and answers a held one as the test says. Requests
// that are not held are answered by the fake clientset at once.
//
// A reactor on the fake clientset cannot hold a request: the fake runs its
// reactors under one lock, so one held request would hold every other.
// So the clientset is wrapped instead, at Pods(ns).Patch and Bind. The
// wrapper's CoreV1().RESTClient() is the fake's (not a *rest.RESTClient),
// so the drop-in runs its calls on this clientset as it is, as upstream
// does.
type server struct {
	fake *fake.Clientset

	mu    sync.Mutex
	step  int             // the script's step, stamped on each request
	armed map[string]bool // pod → hold its next request
	held  map[string]*request
	reqs  []*request // in order of arrival
}

// request is one request that reached the server.
type request struct {
	step   int
	pod    string
	what   string     // e.g. "patch status PodScheduled{reason=Unschedulable,status=False}"
	held   bool       // it was held
	answer chan error // for a held request; nil otherwise
	result string     // the answer's class; "" until answered
	at     int        // the step at which a held request was answered
}

func newServer(pods ...*v1.Pod) *server {
	objs := make([]runtime.Object, len(pods))
	for i, p := range pods {
		objs[i] = p
	}
	return &server{fake: fake.NewClientset(objs...), armed: map[string]bool{}, held: map[string]*request{}}
}

// client is the clientset the dispatchers are given.
func (s *server) client() kubernetes.Interface { return &heldClientset{Clientset: s.fake, s: s} }

func (s *server) currentStep() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.step
}

func (s *server) setStep(i int) {
	s.mu.Lock()
	s.step = i
	s.mu.Unlock()
}

// hold arms a hold on pod's next request.
func (s *server) hold(pod string) {
	s.mu.Lock()
	s.armed[pod] = true
	s.mu.Unlock()
}

// release answers pod's held request with err (nil: the fake clientset
// answers it), and returns what it was, or false if none was held.
func (s *server) release(pod string, err error) (string, bool) {
	s.mu.Lock()
	r := s.held[pod]
	delete(s.held, pod)
	if r != nil {
		r.at = s.step
	}
	s.mu.Unlock()
	if r == nil {
		return "", false
	}
	r.answer <- err
	return r.what, true
}

// disarm forgets every armed hold.
func (s *server) disarm() {
	s.mu.Lock()
	clear(s.armed)
	s.mu.Unlock()
}

// isHeld reports whether a request for pod is held.
func (s *server) isHeld(pod string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[pod] != nil
}

// busy lists the pods with a hold armed or a request held.
func (s *server) busy() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := map[string]bool{}
	for p := range s.armed {
		set[p] = true
	}
	for p := range s.held {
		set[p] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// heldPods lists the pods with a request held.
func (s *server) heldPods() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.held))
}

// requests returns a copy of the requests so far.
func (s *server) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]request, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = *r
		out[i].answer = nil
	}
	return out
}

// serve records a request, holds it if a hold is armed for its pod, and
// answers it: with the held answer if that is an error, else with do.
func (s *server) serve(ctx context.Context, pod, what string, do func() error) error {
	s.mu.Lock()
	r := &request{step: s.step, pod: pod, what: what}
	s.reqs = append(s.reqs, r)
	if s.armed[pod] {
		delete(s.armed, pod)
		r.held, r.answer = true, make(chan error, 1)
		s.held[pod] = r
	}
	s.mu.Unlock()
	var err error
	if r.answer != nil {
		select {
		case err = <-r.answer:
		case <-ctx.Done():
			err = context.Cause(ctx)
			s.mu.Lock()
			if s.held[pod] == r {
				delete(s.held, pod)
				r.at = s.step // answered by the cancellation, at this step
			}
			s.mu.Unlock()
		}
	}
	if err == nil {
		err = do()
	}
	s.mu.Lock()
	r.result = class(err)
	s.mu.Unlock()
	return err
}

// pod returns the pod as the server has it.
func (s *server) pod(name string) (*v1.Pod, error) {
	return s.fake.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
}

type heldClientset struct {
	*fake.Clientset
	s *server
}

func (c *heldClientset) CoreV1() corev1.CoreV1Interface {
	return coreV1{CoreV1Interface: c.Clientset.CoreV1(), s: c.s}
}

type coreV1 struct {
	corev1.CoreV1Interface
	s *server
}

func (c coreV1) Pods(ns string) corev1.PodInterface {
	return pods{PodInterface: c.CoreV1Interface.Pods(ns), s: c.s}
}

type pods struct {
	corev1.PodInterface
	s *server
}

func (p pods) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*v1.Pod, error) {
	var out *v1.Pod
	what := "patch " + strings.Join(sub, "/") + " " + describePatch(data)
	if len(sub) == 0 {
		what = "patch " + describePatch(data)
	}
	err := p.s.serve(ctx, name, what, func() error {
		var err error
		out, err = p.PodInterface.Patch(ctx, name, pt, data, opts, sub...)
		return err
	})
	return out, err
}

func (p pods) Bind(ctx context.Context, b *v1.Binding, opts metav1.CreateOptions) error {
	return p.s.serve(ctx, b.Name, "bind "+b.Target.Name, func() error {
		return p.PodInterface.Bind(ctx, b, opts)
	})
}

// describePatch renders what a patch sets: a status patch's conditions
// (the fields it sends, times left out) and nominated node, a label
// patch's labels.
func describePatch(data []byte) string {
	var p struct {
		Metadata struct {
			Labels map[string]*string `json:"labels"`
		} `json:"metadata"`
		Status struct {
			Conditions        []map[string]any `json:"conditions"`
			NominatedNodeName *string          `json:"nominatedNodeName"`
		} `json:"status"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return "unparsable " + string(data)
	}
	var parts []string
	for _, c := range p.Status.Conditions {
		var fields []string
		for _, k := range slices.Sorted(maps.Keys(c)) {
			if k == "type" || strings.HasSuffix(k, "Time") {
				continue
			}
			fields = append(fields, fmt.Sprintf("%s=%v", k, c[k]))
		}
		parts = append(parts, fmt.Sprintf("%v{%s}", c["type"], strings.Join(fields, ",")))
	}
	if n := p.Status.NominatedNodeName; n != nil {
		parts = append(parts, "nominatedNodeName="+*n)
	}
	for _, k := range slices.Sorted(maps.Keys(p.Metadata.Labels)) {
		v := "null"
		if s := p.Metadata.Labels[k]; s != nil {
			v = *s
		}
		parts = append(parts, "label "+k+"="+v)
	}
	return strings.Join(parts, " ")
}
