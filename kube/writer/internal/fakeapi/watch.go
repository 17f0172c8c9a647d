package fakeapi

import (
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
)

// watcher is one watch the server serves: the events of one resource, in
// one namespace or all (ns ""), in the order the server made the changes.
// It holds every event until its reader takes it, however far behind that
// reader is; its goroutine hands them over, and ends at Stop.
type watcher struct {
	gvr schema.GroupVersionResource
	ns  string
	out chan watch.Event

	mu      sync.Mutex
	held    []watch.Event
	more    chan struct{} // has a value when held has events the goroutine may not have seen
	stop    chan struct{}
	stopped bool
}

// watch is the fake clientset's watch reactor.
func (s *Server) watch(action k8stesting.Action) (bool, watch.Interface, error) {
	w := &watcher{
		gvr: action.GetResource(), ns: action.GetNamespace(),
		out: make(chan watch.Event), more: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	s.mu.Lock()
	s.watchers = append(s.watchers, w)
	s.mu.Unlock()
	go w.run()
	return true, w, nil
}

// Watching returns how many watches the server serves. A watch sees only
// the changes made after it starts: this server keeps no history to
// replay from a resourceVersion, as a real one does, so a caller that
// starts an informer and then makes changes waits for its watch first.
func (s *Server) Watching() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.watchers {
		w.mu.Lock()
		if !w.stopped {
			n++
		}
		w.mu.Unlock()
	}
	return n
}

// notify gives each watcher of gvr in ns an event of type t for o. It is
// called with s.mu held, so that the events follow the changes' order.
func (s *Server) notify(gvr schema.GroupVersionResource, ns string, t watch.EventType, o runtime.Object) {
	live := s.watchers[:0]
	for _, w := range s.watchers {
		if w.push(gvr, ns, t, o) {
			live = append(live, w)
		}
	}
	clear(s.watchers[len(live):])
	s.watchers = live
}

// push holds an event for o if w watches gvr in ns. It reports whether w
// is still watching.
func (w *watcher) push(gvr schema.GroupVersionResource, ns string, t watch.EventType, o runtime.Object) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	if w.gvr != gvr || (w.ns != metav1.NamespaceAll && w.ns != ns) {
		return true
	}
	w.held = append(w.held, watch.Event{Type: t, Object: o.DeepCopyObject()})
	select {
	case w.more <- struct{}{}:
	default:
	}
	return true
}

func (w *watcher) run() {
	defer close(w.out)
	for {
		w.mu.Lock()
		var next watch.Event
		ok := len(w.held) > 0
		if ok {
			next = w.held[0]
			w.held[0] = watch.Event{}
			w.held = w.held[1:]
		}
		w.mu.Unlock()
		if !ok {
			select {
			case <-w.more:
				continue
			case <-w.stop:
				return
			}
		}
		select {
		case w.out <- next:
		case <-w.stop:
			return
		}
	}
}

// Stop ends the watch.
func (w *watcher) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.stopped = true
		close(w.stop)
	}
}

// ResultChan is the watch's events.
func (w *watcher) ResultChan() <-chan watch.Event { return w.out }
