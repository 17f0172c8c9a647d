// Package crclient adapts controller-runtime's client.Client to the
// writer of github.com/coalescer/dispatch/kube/writer: a controller built
// on controller-runtime hands its status (and object) writes to a
// writer.Writer instead of calling Status().Update in Reconcile, and
// Reconcile returns without waiting on the API.
//
// It is a module of its own so that the writer's client-go users never
// build controller-runtime. Everything but the client — the desires,
// modes, fencing, classes, tenants, tickets and stats — is the writer's:
// see its documentation.
//
//	c, err := client.New(writer.RESTConfig(mgr.GetConfig()), client.Options{Scheme: mgr.GetScheme()})
//	w, err := writer.New(crclient.New[*v1.Widget](c, nil), writer.Options[*v1.Widget]{
//		Classes: map[string]int{"ready": 10, "routine": 0},
//	})
//	defer w.Close(ctx)
//
//	func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
//		var widget v1.Widget
//		if err := r.Get(ctx, req.NamespacedName, &widget); err != nil {
//			return ctrl.Result{}, client.IgnoreNotFound(err)
//		}
//		// ... the controller's work ...
//		return ctrl.Result{}, r.w.Set(&widget, writer.Desire[*v1.Widget]{Status: func(o *v1.Widget) error {
//			meta.SetStatusCondition(&o.Status.Conditions, readyCondition(o))
//			return nil
//		}}, writer.SetOptions{Class: "ready"})
//	}
//
// Give an unstructured or a metadata-only object
// (*metav1.PartialObjectMetadata) with its apiVersion and kind, by which
// controller-runtime reads and writes it, and write a metadata-only object
// in writer.ModePatch: controller-runtime refuses to update one.
//
// The object given to Set is read until its write is done: controller-runtime's
// cached client returns a copy of its own on each Get, which the reconciler
// then must not modify after Set.
//
// # Concurrency
//
// The Client New returns is safe for concurrent use if c and its reader
// are, as controller-runtime's are.
package crclient
