package kube

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// podAPI is the four pod requests the calls make.
type podAPI interface {
	get(ctx context.Context, namespace, name string) (*v1.Pod, error)
	patchStatus(ctx context.Context, namespace, name string, patch []byte) (*v1.Pod, error)
	bind(ctx context.Context, b *v1.Binding) error
	delete(ctx context.Context, namespace, name string, uid types.UID) error
}

// podsFor picks how to reach the pods API. A clientset built from a
// rest.Config has a REST client: requests go through it with client-go's
// own retry loop off, so that a 429 or 5xx with Retry-After comes back at
// once and the dispatcher waits it out in its queue, holding no worker
// (client-go would otherwise sleep it out inside the worker, up to 10
// times, and the dispatcher would never see the server's hint). Any other
// kubernetes.Interface — the fake clientset, a wrapper — is used through
// its typed methods.
func podsFor(client kubernetes.Interface) podAPI {
	if rc, ok := client.CoreV1().RESTClient().(*rest.RESTClient); ok && rc != nil {
		return restPods{rc}
	}
	return typedPods{client}
}

// typedPods makes the requests through the typed clientset.
type typedPods struct{ client kubernetes.Interface }

func (p typedPods) get(ctx context.Context, namespace, name string) (*v1.Pod, error) {
	return p.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (p typedPods) patchStatus(ctx context.Context, namespace, name string, patch []byte) (*v1.Pod, error) {
	return p.client.CoreV1().Pods(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
}

func (p typedPods) bind(ctx context.Context, b *v1.Binding) error {
	return p.client.CoreV1().Pods(b.Namespace).Bind(ctx, b, metav1.CreateOptions{})
}

func (p typedPods) delete(ctx context.Context, namespace, name string, uid types.UID) error {
	return p.client.CoreV1().Pods(namespace).Delete(ctx, name, deleteOptions(uid))
}

// restPods makes the same requests as the typed clientset, through its
// REST client, one attempt each (MaxRetries(0)).
type restPods struct{ rc *rest.RESTClient }

func (p restPods) get(ctx context.Context, namespace, name string) (*v1.Pod, error) {
	pod := &v1.Pod{}
	err := p.rc.Get().Namespace(namespace).Resource("pods").Name(name).
		MaxRetries(0).Do(ctx).Into(pod)
	if err != nil {
		return nil, err
	}
	return pod, nil
}

func (p restPods) patchStatus(ctx context.Context, namespace, name string, patch []byte) (*v1.Pod, error) {
	pod := &v1.Pod{}
	err := p.rc.Patch(types.StrategicMergePatchType).Namespace(namespace).Resource("pods").Name(name).
		SubResource("status").Body(patch).MaxRetries(0).Do(ctx).Into(pod)
	if err != nil {
		return nil, err
	}
	return pod, nil
}

func (p restPods) bind(ctx context.Context, b *v1.Binding) error {
	return p.rc.Post().Namespace(b.Namespace).Resource("pods").Name(b.Name).
		SubResource("binding").Body(b).MaxRetries(0).Do(ctx).Error()
}

func (p restPods) delete(ctx context.Context, namespace, name string, uid types.UID) error {
	opts := deleteOptions(uid)
	return p.rc.Delete().Namespace(namespace).Resource("pods").Name(name).
		Body(&opts).MaxRetries(0).Do(ctx).Error()
}

func deleteOptions(uid types.UID) metav1.DeleteOptions {
	return metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
}
