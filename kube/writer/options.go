package writer

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/coalescer/dispatch"
	"github.com/coalescer/dispatch/kube/internal/preset"
	"golang.org/x/time/rate"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Mode is how a Writer sends a desire, what a write costs in requests, and
// what happens when someone else changed the object first. Every mode sends
// nothing for a desire that changes nothing, and fences every write by the
// object's UID (see the package documentation, "Fencing").
type Mode uint8

const (
	// ModeUpdate (the default) replaces the status (or the object) with
	// the change applied to the newest object the writer knows, sending its
	// resourceVersion and UID as preconditions: one request per write. If
	// the server refuses it as stale (409), the writer reads the object
	// (one request) and applies the change again to what it read — so a
	// concurrent writer's change is kept, never overwritten — and, unless
	// the desire is now met, writes again (one more). A desire with no
	// baseline (an object given without a resourceVersion, and none known)
	// costs a read first.
	ModeUpdate Mode = iota
	// ModePatch sends a JSON patch of only what the change changed, each
	// changed field tested against the value the writer last saw: one
	// request per write, and a refusal only when someone else changed one
	// of those very fields (a list, such as conditions, is one field);
	// other fields may change meanwhile. A refusal costs a read and a
	// second patch, tested against the resourceVersion read. Reads as
	// ModeUpdate's. What the change changed is judged on the newest object
	// the writer knows, which may be behind the server's. A field the
	// change sets to the value it already has on that object is not sent:
	// if another writer changed it since, the patch does not restore it
	// (their change's watch event brings the reconcile that does), where
	// ModeUpdate's conflict would.
	ModePatch
	// ModeApply sends a server-side apply with Options.FieldManager: the
	// change sets, on an object holding only the identity, the fields this
	// manager owns. One request per write, no read ever needed, and no
	// conflict on fields it owns; a field another manager owns is a
	// conflict (409) that re-reading cannot resolve, so it ends the write
	// Failed, unless Options.Force takes the field over. See the package
	// documentation for what a no-op means here, and for the fence's one
	// gap (a custom resource's status) and Options.ApplyResourceVersion.
	ModeApply
)

func (m Mode) String() string {
	switch m {
	case ModeUpdate:
		return "update"
	case ModePatch:
		return "patch"
	case ModeApply:
		return "apply"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Tenancy says how a Writer groups writes into tenants, for fairness and
// quotas (Options.Tenants, DefaultTenant).
type Tenancy uint8

const (
	TenancyNone      Tenancy = iota // one tenant, ""
	TenancyNamespace                // one per namespace: a noisy namespace cannot starve the others
	// TenancyKind makes one tenant per kind, named by its group and kind
	// as schema.GroupKind prints them ("ConfigMap", "Deployment.apps"):
	// the object's own apiVersion and kind if it names a kind, else, for a
	// typed object whose TypeMeta is empty (as typed clients and informers
	// leave it), its type's, found as a ModeApply finds it — in the
	// client's scheme (crclient's), else in client-go's
	// (k8s.io/client-go/kubernetes/scheme.Scheme). A Set of an object whose
	// kind cannot be told is refused, unless SetOptions.Tenant names its
	// tenant.
	TenancyKind
)

// Options configures New. The zero value is valid: ModeUpdate, one class
// and one tenant, 50 requests a second (burst 100), and the dispatch
// defaults for the rest.
type Options[O Object] struct {
	Mode Mode
	// FieldManager names the writer in managedFields (every mode) and is
	// the field manager of ModeApply. "" means "dispatch-writer"; the API
	// server's rule holds (at most 128 printable characters).
	FieldManager string
	// Force, in ModeApply, takes over fields another manager owns instead
	// of failing with a conflict. Only for fields this controller alone
	// should decide.
	Force bool
	// ApplyResourceVersion, in ModeApply, also sends the resourceVersion
	// of the newest object the writer knows, so that the server refuses
	// the apply if the object changed since; the writer then re-reads and
	// applies again, as ModeUpdate does; a desire with no such object
	// (given without a resourceVersion, or older than the writer's own
	// last write) reads it first. It is the fence for a custom resource's
	// status, whose apply ignores metadata.uid (see the package
	// documentation), at ModeUpdate's cost in conflicts and reads.
	ApplyResourceVersion bool

	// Classes names the write classes and their priorities: a higher
	// priority is written first, and priorities a band apart
	// (AgingBand, 10 by default) never overtake one another by aging —
	// {"ready": 10, "routine": 0} writes every Ready flip before any
	// routine write queued. The class "" is always known (priority 0
	// unless named here); a Set naming another class not listed is
	// refused. The class is the write's label in Stats and metrics.
	Classes map[string]int
	// Merge, if set, combines a change with the pending change for the same
	// object and target into the change to write: Chain keeps both. nil:
	// the newest change replaces the pending one (its desire is the whole
	// truth). A pending change whose write has landed already (a write
	// retried for the object's other target) is not merged: the newer
	// change is written alone.
	Merge func(pending, incoming Change[O]) Change[O]

	// Tenancy groups writes into tenants, each bounded by its entry in
	// Tenants, or by DefaultTenant (dispatch.TenantConfig: MaxQueued,
	// MaxInFlight, Weight). Tenants at the same priority take turns by
	// weight. SetOptions.Tenant overrides it per write.
	Tenancy       Tenancy
	Tenants       map[string]dispatch.TenantConfig
	DefaultTenant dispatch.TenantConfig

	// QPS bounds the writer's requests per second: a token is taken before
	// the write to send is chosen, so the most urgent one gets it, and each
	// further request of a write (a read after a conflict) takes one too.
	// 0 means 50; a negative value means no limit. A positive value must
	// allow one request a minute; NaN and +Inf are refused. Give the
	// client no limit of its own (RESTConfig).
	QPS float64
	// Burst is the limiter's burst (0 means 100); with a negative QPS (no
	// limit) it must be 0.
	Burst int
	// RateLimit, if set, is the limiter instead (QPS and Burst then 0):
	// one shared with other writers, say.
	RateLimit dispatch.RateLimiter

	// Workers bounds the requests in flight (0 means 16). Capacity bounds
	// the objects with a write queued or in flight (0 means 10 000),
	// beyond which a new object's write is refused (ErrBackpressure)
	// unless it outranks a droppable one; MaxWaiters bounds live tickets
	// (0 means 4 × Capacity).
	Workers, Capacity, MaxWaiters int
	// ReservedWorkers (less than Workers) are kept for the most urgent
	// class — the highest priority in Classes, and any in its band — so
	// that routine writes held up by a slow server never leave a Ready
	// flip without a worker. 0 keeps none.
	ReservedWorkers int
	// Aging and AgingBand set how a waiting write gains priority within its
	// band (dispatch.Config.Aging, AgingBand).
	Aging     time.Duration
	AgingBand int
	// Retry bounds retries. Its zero fields mean the dispatch defaults,
	// except MaxAttempts (10: a conflict re-read counts as an attempt) and
	// BudgetRatio (1: re-reads after conflicts are not a retry storm).
	Retry dispatch.RetryPolicy
	// Breaker, if set, stops writing after sustained retryable failures.
	Breaker *dispatch.BreakerPolicy
	// Classify judges a failed request (nil: kube.Classify). The writer's
	// own verdicts come first: ErrGone and ErrReplaced, and a Change's
	// error, are permanent; a stale write is re-read and re-applied.
	Classify func(error) dispatch.Class

	// Observer receives the writer's events, labelled by class and tenant
	// (a *dispatchprom.Observer exports them to Prometheus).
	Observer dispatch.Observer
	// OnDone fires once per finished write, after its waiters were told:
	// to requeue an object whose write failed, say.
	OnDone func(Result[O])
}

// The writer's own defaults, where they differ from the core's.
const (
	defaultManager     = "dispatch-writer"
	defaultCapacity    = 10000 // the dispatcher's
	defaultMaxAttempts = 10
	defaultBudgetRatio = 1
)

// check reports a bad setting of the writer's own, naming its field; the
// settings passed to the core are the core's to check.
func (o *Options[O]) check() error {
	badManager := metav1validation.ValidateFieldManager(o.FieldManager, field.NewPath("FieldManager"))
	switch {
	case o.Mode > ModeApply:
		return optErr("Mode", fmt.Sprintf("%d is not a Mode", o.Mode))
	case o.Tenancy > TenancyKind:
		return optErr("Tenancy", fmt.Sprintf("%d is not a Tenancy", o.Tenancy))
	case len(badManager) > 0:
		return fmt.Errorf("writer: Options.%v (the API server would refuse every write)", badManager.ToAggregate())
	case o.Force && o.Mode != ModeApply:
		return optErr("Force", "is for ModeApply only")
	case o.ApplyResourceVersion && o.Mode != ModeApply:
		return optErr("ApplyResourceVersion", "is for ModeApply only")
	case math.IsNaN(o.QPS) || math.IsInf(o.QPS, 0):
		return optErr("QPS", fmt.Sprintf("%v is not a rate", o.QPS))
	case o.QPS > 0 && o.QPS < preset.MinQPS:
		return optErr("QPS", fmt.Sprintf("%.3g is below one request a minute", o.QPS))
	case o.Burst < 0:
		return optErr("Burst", fmt.Sprintf("%d must not be negative", o.Burst))
	case o.QPS < 0 && o.Burst != 0:
		return fmt.Errorf("writer: Options.Burst %d is set, but Options.QPS %v means no limit: leave Burst 0", o.Burst, o.QPS)
	case o.RateLimit != nil && (o.QPS != 0 || o.Burst != 0):
		return errors.New("writer: Options.RateLimit is set: leave QPS and Burst 0")
	}
	return nil
}

// limiter is the writer's rate limiter, or nil for none.
func (o *Options[O]) limiter() dispatch.RateLimiter {
	switch {
	case o.RateLimit != nil:
		return o.RateLimit
	case o.QPS < 0:
		return nil
	}
	return rate.NewLimiter(rate.Limit(cmp.Or(o.QPS, preset.QPS)), cmp.Or(o.Burst, preset.Burst))
}

// retry is Options.Retry with the writer's defaults.
func (o *Options[O]) retry() dispatch.RetryPolicy {
	r := o.Retry
	if r.MaxAttempts == 0 {
		r.MaxAttempts = defaultMaxAttempts
	}
	if r.BudgetRatio == 0 {
		r.BudgetRatio = defaultBudgetRatio
	}
	return r
}

func optErr(field, why string) error {
	return fmt.Errorf("writer: Options.%s %s", field, why)
}
