package dispatch

import (
	"context"
	"maps"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHotPathAllocs pins the allocation counts the benchmarks report, so a
// change that makes the caller's hot loop allocate fails here and not only
// in a benchmark nobody reran: Post onto a pending key allocates nothing;
// with released slots to reuse, Post of a new key allocates nothing and
// Submit of a new key only its Ticket on the caller's side, and end to end,
// the worker's execution included, its Ticket and the Result it reads.
func TestHotPathAllocs(t *testing.T) {
	docSays(t, "README.md", "`Post` is fire-and-forget: no ticket, no allocation when it coalesces")
	t.Run("submit", testSubmitPathAllocs)
	t.Run("worker", testWorkerPathAllocs)
}

// testSubmitPathAllocs pins the caller's side alone, with a backlog.
func testSubmitPathAllocs(t *testing.T) {
	release, started := make(chan struct{}), make(chan struct{}, 1)
	exec := func(ctx context.Context, _ int, _ int) error {
		select {
		case started <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	const runs, queued = 1000, 100
	d := newD(t, exec, Config[int, int]{Workers: 1, Capacity: 10 * runs})
	// The first call keeps the only worker, so everything else stays queued.
	require.NoError(t, d.Post(-1, 0, SubmitOptions{}))
	<-started
	for k := range queued {
		require.NoError(t, d.Post(k, k, SubmitOptions{Priority: k % 10}))
	}

	i := 0
	pending := testing.AllocsPerRun(runs, func() {
		i++
		_ = d.Post(i%queued, i, SubmitOptions{Priority: 5})
	})
	assert.Zero(t, pending, "Post onto a pending key")
	sub := testing.AllocsPerRun(runs, func() {
		i++
		_, _ = d.Submit(bg, i%queued, i, SubmitOptions{Priority: 5})
	})
	// Each key gathers ten tickets here: they share one outcome (one
	// allocation per call) in a list that grows by doubling; AllocsPerRun
	// truncates the average, so this says "under two".
	assert.Equal(t, 1.0, sub, "Submit onto a pending key: its Ticket, and a share of its call's")

	// fill leaves runs+1 released slots on the free list (AllocsPerRun
	// makes one warm-up call), and returns the first key never used.
	next := queued
	fill := func() int {
		k0 := next
		for k := k0; k < k0+runs+1; k++ {
			require.NoError(t, d.Post(k, 0, SubmitOptions{}))
		}
		for k := k0; k < k0+runs+1; k++ {
			require.True(t, d.Cancel(k, nil))
		}
		next += runs + 1
		return next
	}

	k := fill()
	post := testing.AllocsPerRun(runs, func() {
		_ = d.Post(k, 0, SubmitOptions{Priority: 3})
		k++
	})
	assert.Zero(t, post, "Post of a new key")

	k = fill()
	sub = testing.AllocsPerRun(runs, func() {
		_, _ = d.Submit(bg, k, 0, SubmitOptions{Priority: 3})
		k++
	})
	assert.Equal(t, 1.0, sub, "Submit of a new key: its Ticket only")

	close(release)
	closeD(t, d)
}

// testWorkerPathAllocs pins what a call costs end to end, the worker's side
// included: with released lanes to reuse, Post of a new key and its
// execution allocate one thing — the execution's own context, never
// reused (ExecFunc) — and Submit adds its Ticket and, when the call ends,
// the Result its ticket reads (one per call end, shared by every ticket
// told that outcome on time; a ticket's riders share their call's
// instead). An exec that watches its context adds its Done channel.
func testWorkerPathAllocs(t *testing.T) {
	ran := make(chan struct{}, 1)
	watch := false
	exec := func(ctx context.Context, _ int, _ int) error {
		if watch {
			select {
			case <-ctx.Done():
			default:
			}
		}
		ran <- struct{}{}
		return nil
	}
	const runs = 1000
	d := newD(t, exec, Config[int, int]{Workers: 1, Capacity: 10 * runs})
	k := 0
	settle := func() {
		// Warm up: lanes released to the free list.
		for range 2 * runs {
			require.NoError(t, d.Post(k, 0, SubmitOptions{}))
			k++
			<-ran
		}
		require.Eventually(t, func() bool { return d.Stats().Keys == 0 }, 5*time.Second, time.Millisecond)
	}
	settle()
	post := testing.AllocsPerRun(runs, func() {
		_ = d.Post(k, 0, SubmitOptions{Priority: 3})
		k++
		<-ran
	})
	assert.Equal(t, 1.0, post, "Post of a new key, and its execution: its context")

	settle()
	sub := testing.AllocsPerRun(runs, func() {
		_, _ = d.Submit(bg, k, 0, SubmitOptions{Priority: 3})
		k++
		<-ran
	})
	assert.Equal(t, 3.0, sub, "Submit of a new key, and its execution: its Ticket, its context and its outcome")

	settle()
	watch = true
	watched := testing.AllocsPerRun(runs, func() {
		_ = d.Post(k, 0, SubmitOptions{Priority: 3})
		k++
		<-ran
	})
	assert.Equal(t, 2.0, watched, "an exec that watches ctx.Done(): its context and channel")
	closeD(t, d)

	// An Observer hears of the submission, the start and the end of every
	// call, and costs no allocation of its own.
	watch = false
	d = newD(t, exec, Config[int, int]{Workers: 1, Capacity: 10 * runs, Observer: NopObserver{}})
	settle()
	observed := testing.AllocsPerRun(runs, func() {
		_ = d.Post(k, 0, SubmitOptions{Priority: 3})
		k++
		<-ran
	})
	assert.Equal(t, 1.0, observed, "Post of a new key, and its execution, with an Observer: its context")
	closeD(t, d)

	// A labelled call costs nothing for its label, even when the
	// dispatcher is idle between calls and the label has no live call
	// left: it is kept for the next.
	d = newD(t, exec, Config[int, int]{Workers: 1, Capacity: 10 * runs, Label: func(int, int) string { return "patch" }})
	settle()
	labelled := testing.AllocsPerRun(runs, func() {
		_ = d.Post(k, 0, SubmitOptions{Priority: 3})
		k++
		<-ran
		for d.Busy(k - 1) {
			runtime.Gosched()
		}
	})
	assert.Equal(t, 1.0, labelled, "Post of a new key, and its execution, with a label, one call at a time: its context")
	closeD(t, d)
}

// TestIdleLabels: a tag (a tenant and a label) without a live call is kept
// for its next call, and the tags kept so are forgotten once they
// outnumber both maxIdleLabels and the live ones; Stats.Labels counts only
// live calls, by label over every tenant. Without Config.Label a call's
// tag is its tenant's own.
func TestIdleLabels(t *testing.T) {
	x := newTenant[string, int]("x", TenantConfig{})
	y := newTenant[string, int]("y", TenantConfig{})
	lc := liveCalls[string, int]{tags: map[tagKey[string, int]]*callTag[string, int]{}}
	a := lc.add(x, "a")
	lc.remove(a)
	require.Same(t, a, lc.add(x, "a"), "an idle tag is kept for its next call")
	ya := lc.add(y, "a")
	require.NotSame(t, a, ya, "one tag per tenant and label")
	require.Same(t, y, ya.ten)
	require.Same(t, ya, lc.retag(ya, y, "a"), "the same tenant and label keep their tag")
	yb := lc.retag(ya, y, "b")
	require.Equal(t, "b", yb.label)
	require.Equal(t, map[string]int{"a": 1, "b": 1}, lc.counts())
	for i := range 10 * maxIdleLabels {
		lc.remove(lc.add(x, strconv.Itoa(i)))
		require.LessOrEqual(t, len(lc.tags), maxIdleLabels+4, "after %d labels", i+1)
	}
	xa := lc.retag(yb, x, "a")
	require.Same(t, a, xa)
	require.Equal(t, map[string]int{"a": 2}, lc.counts(), "counted by label, over tenants")
	require.Equal(t, 2, lc.n)
	lc.remove(a)
	lc.remove(xa)
	require.Empty(t, lc.counts())
	require.Zero(t, lc.n)

	var bare liveCalls[string, int]
	g := bare.add(x, "")
	require.Same(t, &x.tag, g, "without Config.Label, the tenant's own tag")
	require.Same(t, &y.tag, bare.retag(g, y, ""))
	bare.remove(g)
	require.Zero(t, bare.n)
}

// TestLabelTagsModel: random additions, retags and removals over a few
// tenants and many labels (enough to sweep idle tags out many times)
// against a count per tenant and label. Every live call's tag is the one
// its tenant and label are interned under — a tenant's last tag, kept for
// its next call, is never counted again once the sweep forgot it — and
// Stats' counts by label are the model's.
func TestLabelTagsModel(t *testing.T) {
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 33))
		tens := []*tenant[string, int]{newTenant[string, int]("x", TenantConfig{}), newTenant[string, int]("y", TenantConfig{}), newTenant[string, int]("z", TenantConfig{})}
		lc := liveCalls[string, int]{tags: map[tagKey[string, int]]*callTag[string, int]{}}
		var live []*callTag[string, int]
		want := map[string]int{}
		for step := range 20000 {
			ten := tens[rng.IntN(len(tens))]
			label := strconv.Itoa(rng.IntN(4)) // the usual few
			if rng.IntN(4) == 0 {
				label = strconv.Itoa(rng.IntN(3 * maxIdleLabels)) // and many, rarely
			}
			switch op := rng.IntN(3); {
			case op == 0 || len(live) == 0:
				live = append(live, lc.add(ten, label))
				want[label]++
			case op == 1:
				i := rng.IntN(len(live))
				want[live[i].label]--
				live[i] = lc.retag(live[i], ten, label)
				want[label]++
			default:
				i := rng.IntN(len(live))
				want[live[i].label]--
				lc.remove(live[i])
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
			}
			for _, g := range live {
				require.Same(t, g, lc.tags[tagKey[string, int]{g.ten, g.label}], "seed %d step %d: a live tag not interned", seed, step)
			}
			if step%97 == 0 {
				maps.DeleteFunc(want, func(_ string, n int) bool { return n == 0 })
				require.Equal(t, want, lc.counts(), "seed %d step %d", seed, step)
				require.Equal(t, len(live), lc.n)
				idle := 0
				for _, g := range lc.tags {
					if g.n == 0 {
						idle++
					}
				}
				require.Equal(t, idle, lc.idle, "seed %d step %d: idle tags", seed, step)
			}
		}
	}
}

// TestTicketSize pins the sizes the Ticket documentation states: a
// Ticket's does not depend on K and T, since it holds no copy of its
// outcome. Allocation size classes round 80 to itself, 120 up to 128.
func TestTicketSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the documented sizes are for 64-bit platforms")
	}
	type big struct { // its fields only give it a size
		_ string
		_ [512]byte
	}
	assert.EqualValues(t, 80, unsafe.Sizeof(Ticket[string, int]{}))
	assert.EqualValues(t, 80, unsafe.Sizeof(Ticket[big, big]{}))
	assert.EqualValues(t, 120, unsafe.Sizeof(watchedTicket[string, int]{}))
	assert.EqualValues(t, 120, unsafe.Sizeof(watchedTicket[big, big]{}))
}
