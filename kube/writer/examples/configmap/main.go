// Command configmap is a tiny controller that writes through the writer:
// for every ConfigMap labelled demo=true it keeps an annotation saying how
// many keys the ConfigMap holds, and a "ready" annotation once it has
// any. Reconcile never waits on the API: it says what the object should
// look like (writer.Set) and returns.
//
// It runs against client-go's fake clientset, behind a stand-in for the
// API server's write semantics (resourceVersions, conflicts, the UID
// fence), so it needs no cluster:
//
//	go run ./kube/writer/examples/configmap -objects 20 -edits 10
//
// To run it against a cluster, build the clientset from a kubeconfig, and
// the writer's from writer.RESTConfig of the same config.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/coalescer/dispatch/kube/writer"
	"github.com/coalescer/dispatch/kube/writer/internal/fakeapi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

const (
	keysAnnotation  = "demo.example.com/keys"
	readyAnnotation = "demo.example.com/ready"
)

func main() {
	objects := flag.Int("objects", 20, "ConfigMaps to create")
	edits := flag.Int("edits", 10, "edits of each ConfigMap's data, as fast as they come")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *objects, *edits); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// controller reconciles ConfigMaps from an informer's cache.
type controller struct {
	lister listers.ConfigMapLister
	queue  workqueue.TypedInterface[cache.ObjectName]
	w      *writer.Writer[*corev1.ConfigMap]
}

// reconcile is the whole of the controller's logic: it computes the
// desired annotations from the object as the cache has it, and hands
// them to the writer. A "ready" flip is written before routine counts.
func (c *controller) reconcile(key cache.ObjectName) error {
	cm, err := c.lister.ConfigMaps(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil // deleted: the writer's informer handler forgot it
	}
	if err != nil {
		return err
	}
	class := "routine"
	if len(cm.Data) > 0 && cm.Annotations[readyAnnotation] != "true" {
		class = "ready"
	}
	return c.w.Set(cm, writer.Desire[*corev1.ConfigMap]{Object: func(o *corev1.ConfigMap) error {
		metav1.SetMetaDataAnnotation(&o.ObjectMeta, keysAnnotation, strconv.Itoa(len(o.Data)))
		if len(o.Data) > 0 {
			metav1.SetMetaDataAnnotation(&o.ObjectMeta, readyAnnotation, "true")
		}
		return nil
	}}, writer.SetOptions{Class: class})
}

func (c *controller) work() {
	for {
		key, quit := c.queue.Get()
		if quit {
			return
		}
		if err := c.reconcile(key); err != nil {
			fmt.Fprintln(os.Stderr, "reconcile", key, err)
		}
		c.queue.Done(key)
	}
}

// run starts the controller, makes objects ConfigMaps and edits each edits
// times, waits until every ConfigMap shows its key count, and prints what
// it cost.
func run(ctx context.Context, out io.Writer, objects, edits int) error {
	cs := fake.NewSimpleClientset()
	srv, err := fakeapi.Install(&cs.Fake, cs.Tracker())
	if err != nil {
		return err
	}
	var client kubernetes.Interface = cs
	w, err := writer.New(writer.Typed(func(ns string) writer.TypedClient[*corev1.ConfigMap] {
		return client.CoreV1().ConfigMaps(ns)
	}), writer.Options[*corev1.ConfigMap]{
		Classes: map[string]int{"ready": 10, "routine": 0},
		Tenancy: writer.TenancyNamespace,
	})
	if err != nil {
		return err
	}
	c, stop, err := start(ctx, client, w)
	if err != nil {
		return err
	}
	defer stop()
	// The fake API server does not replay to a watch that starts late,
	// as a real one does from the list's resourceVersion: the changes
	// wait for the informer's watch.
	for srv.Watching() == 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}

	start := time.Now()
	if err := drive(ctx, client, objects, edits); err != nil {
		return err
	}
	if err := settle(ctx, c, objects); err != nil {
		return err
	}
	if err := w.Close(ctx); err != nil {
		return err
	}
	s := w.Stats()
	fmt.Fprintf(out, "%d ConfigMaps, %d edits each, settled in %v\n", objects, edits, time.Since(start).Round(time.Millisecond))
	fmt.Fprintf(out, "desires: %d  writes: %d  not sent (no change): %d  conflicts re-applied: %d  reads: %d\n",
		s.Desires, s.Written, s.NoOps, s.Conflicts, s.Reads)
	return nil
}

// start runs an informer and the controller's worker; stop ends both.
func start(ctx context.Context, client kubernetes.Interface, w *writer.Writer[*corev1.ConfigMap]) (*controller, func(), error) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = "demo=true"
	}))
	inf := factory.Core().V1().ConfigMaps()
	c := &controller{lister: inf.Lister(), queue: workqueue.NewTyped[cache.ObjectName](), w: w}
	enqueue := func(obj any) {
		if key, err := cache.ObjectToName(obj); err == nil {
			c.queue.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: func(obj any) {
			if m, err := metaOf(obj); err == nil {
				w.Forget(m.GetUID()) // end what waits for it, at once
			}
		},
	}); err != nil {
		return nil, nil, err
	}
	stopCh := make(chan struct{})
	factory.Start(stopCh)
	factory.WaitForCacheSync(stopCh)
	done := make(chan struct{})
	go func() { c.work(); close(done) }()
	return c, func() {
		c.queue.ShutDown()
		<-done
		close(stopCh)
		factory.Shutdown()
	}, nil
}

func metaOf(obj any) (metav1.Object, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return nil, fmt.Errorf("not a ConfigMap: %T", obj)
	}
	return cm, nil
}

// drive creates the ConfigMaps and edits their data, as other clients do.
func drive(ctx context.Context, client kubernetes.Interface, objects, edits int) error {
	cms := client.CoreV1().ConfigMaps("demo")
	for i := range objects {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: fmt.Sprint("cm-", i), Labels: map[string]string{"demo": "true"}}}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for e := range edits {
		for i := range objects {
			err := editData(ctx, cms, fmt.Sprint("cm-", i), fmt.Sprint("k", e))
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// editData adds key to a ConfigMap's data, re-reading on a conflict: the
// other client racing the controller.
func editData(ctx context.Context, cms interface {
	Get(context.Context, string, metav1.GetOptions) (*corev1.ConfigMap, error)
	Update(context.Context, *corev1.ConfigMap, metav1.UpdateOptions) (*corev1.ConfigMap, error)
}, name, key string) error {
	for {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[key] = "v"
		if _, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
			return err
		}
	}
}

// settle waits until every ConfigMap's annotation shows its key count.
func settle(ctx context.Context, c *controller, objects int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		done := 0
		for i := range objects {
			cm, err := c.lister.ConfigMaps("demo").Get(fmt.Sprint("cm-", i))
			if err == nil && cm.Annotations[keysAnnotation] == strconv.Itoa(len(cm.Data)) && !c.w.Busy(cm.UID) {
				done++
			}
		}
		if done == objects {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not settled: %d of %d ConfigMaps: %w", done, objects, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
