package dispatch

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/btree"
	"golang.org/x/time/rate"
)

// The benchmarks measure what the caller's hot loop pays. Names are
// key=value so benchstat can group and compare them, e.g.
//
//	go test -run '^$' -bench . -benchmem -count 6 . > bench.txt
//	benchstat bench.txt
//	benchstat -col /op -filter '.name:Submit' bench.txt
//
// Queue-depth benchmarks hold a steady backlog: one worker is parked in a
// blocking exec, so every other call stays queued, and the calls a batch of
// timed submissions adds are cancelled with the timer stopped. The depth
// therefore stays between queued and queued+batch, and only the submission
// itself is timed.

// benchQueued are the backlog sizes of BenchmarkSubmit.
var benchQueued = []int{1_000, 100_000, 1_000_000}

// benchBatch is how many timed submissions run between two untimed
// clean-ups: a tenth of the backlog, at most 1000, so the depth stays
// within 10% of queued and the timer is paused rarely.
func benchBatch(queued int) int { return max(1, min(queued/10, 1000)) }

// benchPrios returns n priorities drawn uniformly from [0, levels), from a
// fixed seed so every run and every implementation sees the same sequence.
// With the default aging (one level per second) and levels=10, new calls
// land at about ten places in the ready index, as in a scheduler with a few
// priority classes; with levels=1000000 they land anywhere, which is the
// worst case for the B-tree's cache behaviour.
func benchPrios(n, levels int) []int {
	r := rand.New(rand.NewPCG(1, uint64(levels)))
	p := make([]int, n)
	for i := range p {
		p[i] = r.IntN(levels)
	}
	return p
}

// settle collects garbage and returns freed memory to the OS before the
// next measurement, so that neither a pending GC cycle nor the background
// scavenger of a backlog freed just before runs inside it.
func settle() { debug.FreeOSMemory() }

// loopBatched times op(i) for i = 0, 1, ... and calls undo(lo, hi) with the
// timer stopped after every batch ops, and once more at the end, so that
// the state op sees stays steady however many iterations the benchmark
// runs. It returns how many times op ran.
func loopBatched(b *testing.B, batch int, op func(i int), undo func(lo, hi int)) int {
	b.ReportAllocs()
	i, lo := 0, 0
	for b.Loop() {
		op(i)
		i++
		if i-lo == batch {
			b.StopTimer()
			undo(lo, i)
			lo = i
			b.StartTimer()
		}
	}
	undo(lo, i)
	return i
}

// parked is a Dispatcher[int, int] with one worker parked in exec, so that
// every other call stays queued: a backlog that does not drain while a
// benchmark measures submissions into it.
type parked struct {
	d       *Dispatcher[int, int]
	release chan struct{}
	next    int // the next key never used
}

// newParked returns a parked dispatcher holding queued ready calls with
// priorities from prios, and room for extra more keys.
func newParked(b *testing.B, queued, extra int, prios []int, cfg Config[int, int]) *parked {
	b.Helper()
	p := startParked(b, queued+extra+1, cfg)
	d := p.d
	for i := range queued {
		if err := d.Post(i, i, SubmitOptions{Priority: prios[i%len(prios)]}); err != nil {
			b.Fatal(err)
		}
	}
	p.next = queued
	if st := d.Stats(); st.Ready != queued || st.Keys != queued+1 {
		b.Fatalf("backlog: ready=%d keys=%d, want %d and %d", st.Ready, st.Keys, queued, queued+1)
	}
	settle()
	return p
}

// startParked starts a parked dispatcher with room for capacity calls,
// its one worker parked in key -1's call, and nothing else queued.
func startParked(b *testing.B, capacity int, cfg Config[int, int]) *parked {
	b.Helper()
	p := &parked{release: make(chan struct{})}
	exec := func(ctx context.Context, _, _ int) error {
		select {
		case <-p.release:
		case <-ctx.Done():
		}
		return nil
	}
	cfg.Workers, cfg.Capacity = 1, capacity
	d, err := New(exec, cfg)
	if err != nil {
		b.Fatal(err)
	}
	p.d = d
	// The first call takes the only worker and keeps it.
	if err := d.Post(-1, 0, SubmitOptions{}); err != nil {
		b.Fatal(err)
	}
	for d.Stats().InFlight != 1 {
		time.Sleep(100 * time.Microsecond)
	}
	return p
}

// fresh reserves n keys never used before and returns the first.
func (p *parked) fresh(n int) int {
	k := p.next
	p.next += n
	return k
}

// cancel takes keys [lo, hi) out again.
func (p *parked) cancel(lo, hi int) {
	for k := lo; k < hi; k++ {
		p.d.Cancel(k, nil)
	}
}

func (p *parked) close(b *testing.B) {
	b.Helper()
	close(p.release)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // end the backlog as Closed at once; nothing to drain
	_ = p.d.Close(ctx)
}

// BenchmarkSubmit measures a submission of a new key into a dispatcher that
// already holds queued ready calls: a map insert, a slot (reused from the
// keys the batches cancel) and a B-tree insert under the lock. op=post is the fire-and-forget form, op=submit
// returns a ticket (context.Background: no cancellation to watch), and
// op=submitctx a ticket whose context can be cancelled (one
// context.AfterFunc registration). op=naiveheap is the naive baseline — a
// mutex, container/heap and a map, deduplicating by key — and op=mapbtree
// the floor the design aims at: a mutex, a map and a google/btree insert with
// nothing else.
func BenchmarkSubmit(b *testing.B) {
	for _, queued := range benchQueued {
		for _, levels := range []int{10, 1_000_000} {
			b.Run(fmt.Sprintf("queued=%d/levels=%d", queued, levels), func(b *testing.B) {
				benchSubmit(b, queued, levels)
			})
		}
	}
}

func benchSubmit(b *testing.B, queued, levels int) {
	batch := benchBatch(queued)
	prios := benchPrios(queued+batch, levels)
	next := prios[queued:] // the priorities of timed submissions
	prio := func(i int) int { return next[i%len(next)] }

	p := newParked(b, queued, batch, prios[:queued], Config[int, int]{})
	b.Run("op=post", func(b *testing.B) {
		k0 := p.next
		n := loopBatched(b, batch, func(i int) {
			if err := p.d.Post(k0+i, i, SubmitOptions{Priority: prio(i)}); err != nil {
				b.Fatal(err)
			}
		}, func(lo, hi int) { p.cancel(k0+lo, k0+hi) })
		p.fresh(n)
	})
	submit := func(ctx context.Context) func(b *testing.B) {
		return func(b *testing.B) {
			k0 := p.next
			n := loopBatched(b, batch, func(i int) {
				if _, err := p.d.Submit(ctx, k0+i, i, SubmitOptions{Priority: prio(i)}); err != nil {
					b.Fatal(err)
				}
			}, func(lo, hi int) { p.cancel(k0+lo, k0+hi) })
			p.fresh(n)
		}
	}
	b.Run("op=submit", submit(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	b.Run("op=submitctx", submit(ctx))
	cancel()
	if st := p.d.Stats(); st.Ready != queued {
		b.Fatalf("backlog drifted: ready=%d, want %d", st.Ready, queued)
	}
	p.close(b)
	p = nil
	settle()

	b.Run("op=naiveheap", func(b *testing.B) {
		q := newNaiveHeap()
		for i := range queued {
			q.push(i, i, prios[i])
		}
		settle()
		k0 := queued
		loopBatched(b, batch, func(i int) {
			q.push(k0+i, i, prio(i))
		}, func(lo, hi int) {
			for k := lo; k < hi; k++ {
				q.remove(k0 + k)
			}
		})
	})
	settle()

	b.Run("op=mapbtree", func(b *testing.B) {
		q := newMapBTree()
		now := time.Now()
		for i := range queued {
			q.push(i, i, prios[i], now)
		}
		settle()
		k0 := queued
		loopBatched(b, batch, func(i int) {
			q.push(k0+i, i, prio(i), time.Now())
		}, func(lo, hi int) {
			for k := lo; k < hi; k++ {
				q.remove(k0 + k)
			}
		})
	})
	settle()
}

// BenchmarkPost measures the fire-and-forget submission. key=pending posts
// onto keys whose calls are already queued, in a random order, at each
// call's own priority: the path that must cost neither an allocation nor
// index work. queued=1 is one object updated over and over; with 100000
// pending keys every post is a cache miss on the key's slot. key=new adds a
// new key to a backlog of 1000, and key=new/fill=100000 100 000 new keys
// to a fresh dispatcher, over and over. impl=naiveheap is the naive
// baseline on the paths with a backlog, impl=map on the fill.
func BenchmarkPost(b *testing.B) {
	{
		const queued = 1000
		batch := benchBatch(queued)
		prios := benchPrios(queued+batch, 10)
		next := prios[queued:]
		b.Run("impl=dispatch/key=new/queued=1000", func(b *testing.B) {
			p := newParked(b, queued, batch, prios[:queued], Config[int, int]{})
			defer p.close(b)
			k0 := p.next
			loopBatched(b, batch, func(i int) {
				if err := p.d.Post(k0+i, i, SubmitOptions{Priority: next[i%len(next)]}); err != nil {
					b.Fatal(err)
				}
			}, func(lo, hi int) { p.cancel(k0+lo, k0+hi) })
		})
		b.Run("impl=naiveheap/key=new/queued=1000", func(b *testing.B) {
			q := newNaiveHeap()
			for i := range queued {
				q.push(i, i, prios[i])
			}
			loopBatched(b, batch, func(i int) {
				q.push(queued+i, i, next[i%len(next)])
			}, func(lo, hi int) {
				for k := lo; k < hi; k++ {
					q.remove(queued + k)
				}
			})
		})
	}

	// A burst into an empty dispatcher, as a controller's first list of
	// every object: each op is one new key, and each run of fill keys
	// starts from a fresh dispatcher, so the key table grows as the keys
	// arrive. impl=map is the same with a mutex, a Go map and a FIFO slice,
	// the shape of client-go's workqueue.
	{
		const fill = 100_000
		prios := benchPrios(fill, 10)
		b.Run("impl=dispatch/key=new/fill=100000", func(b *testing.B) {
			var p *parked
			loopFills(b, fill, func() {
				if p != nil {
					p.close(b)
				}
				p = startParked(b, fill+1, Config[int, int]{})
			}, func(i int) {
				if err := p.d.Post(i%fill, i, SubmitOptions{Priority: prios[i%fill]}); err != nil {
					b.Fatal(err)
				}
			})
			p.close(b)
		})
		b.Run("impl=map/key=new/fill=100000", func(b *testing.B) {
			var q *mapFIFO
			loopFills(b, fill, func() { q = &mapFIFO{set: map[int]struct{}{}} }, func(i int) { q.add(i % fill) })
		})
	}

	for _, queued := range []int{1, 1000, 100_000} {
		prios := benchPrios(queued, 10)
		order := rand.New(rand.NewPCG(3, 4)).Perm(queued)
		b.Run(fmt.Sprintf("impl=dispatch/key=pending/queued=%d", queued), func(b *testing.B) {
			p := newParked(b, queued, 0, prios, Config[int, int]{})
			defer settle()
			defer p.close(b)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := order[i%queued]
				if err := p.d.Post(k, i, SubmitOptions{Priority: prios[k]}); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
		b.Run(fmt.Sprintf("impl=naiveheap/key=pending/queued=%d", queued), func(b *testing.B) {
			q := newNaiveHeap()
			for k := range queued {
				q.push(k, k, prios[k])
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := order[i%queued]
				q.push(k, i, prios[k])
				i++
			}
		})
	}
}

// loopFills runs op(i) for each iteration of b.Loop, and fresh, untimed,
// before every run of fill of them: each run fills a fresh structure.
func loopFills(b *testing.B, fill int, fresh func(), op func(i int)) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%fill == 0 {
			b.StopTimer()
			fresh()
			b.StartTimer()
		}
		op(i)
	}
}

// mapFIFO is a mutex, a set and a FIFO slice: what client-go's workqueue
// does to add a key, for BenchmarkPost's fill.
type mapFIFO struct {
	mu    sync.Mutex
	set   map[int]struct{}
	queue []int
}

func (q *mapFIFO) add(k int) {
	q.mu.Lock()
	if _, ok := q.set[k]; !ok {
		q.set[k] = struct{}{}
		q.queue = append(q.queue, k)
	}
	q.mu.Unlock()
}

// BenchmarkSubmitCoalesce measures Submit onto a key whose call is already
// queued: the submission merges (Config.Merge) and returns its own ticket. The
// tickets pile up on the one call, so every 1000 the key is cancelled and
// posted again with the timer stopped. ctx=background watches no context;
// ctx=cancel registers one context.AfterFunc per ticket.
func BenchmarkSubmitCoalesce(b *testing.B) {
	const batch = 1000
	sum := func(a, b int) (int, error) { return a + b, nil }
	run := func(ctx context.Context) func(b *testing.B) {
		return func(b *testing.B) {
			p := newParked(b, 1, batch, []int{0}, Config[int, int]{Merge: sum, MaxWaiters: 2 * batch})
			defer p.close(b)
			loopBatched(b, batch, func(i int) {
				if _, err := p.d.Submit(ctx, 0, 1, SubmitOptions{}); err != nil {
					b.Fatal(err)
				}
			}, func(lo, hi int) {
				p.d.Cancel(0, nil)
				if err := p.d.Post(0, 0, SubmitOptions{}); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
	b.Run("ctx=background", run(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.Run("ctx=cancel", run(ctx))
}

// BenchmarkClock measures one reading of the dispatcher's clock (now), the
// monotonic clock behind every enqueue, start and end time. A Submit reads
// it for its ticket's enqueue time; a Post that coalesces into a pending
// call does not. Its cost depends on the machine's clock source: on a
// virtual machine it can be a large part of a coalescing submission.
func BenchmarkClock(b *testing.B) {
	d, err := New(func(context.Context, int, int) error { return nil }, Config[int, int]{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close(context.Background())
	var sum int64
	for b.Loop() {
		sum += d.clk.now()
	}
	if sum == 0 {
		b.Fatal("no clock reading was taken")
	}
}

// BenchmarkThroughput measures the whole path, submit → no-op exec →
// outcome, per call, with up to 256 calls outstanding. Every call has its own
// key, so nothing coalesces. op=submit waits on tickets; op=post counts
// completions through the Config.OnDone hook. impl=goroutine is the naive
// baseline upstream's dispatcher became in #134154: a map for coalescing and
// a goroutine per call, with no worker bound and no order.
func BenchmarkThroughput(b *testing.B) {
	const window = 256
	nop := func(context.Context, int, int) error { return nil }
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("impl=dispatch/op=submit/workers=%d", workers), func(b *testing.B) {
			d, err := New(nop, Config[int, int]{Workers: workers, Capacity: 2 * window})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close(context.Background())
			ring := make([]*Ticket[int, int], window)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if t := ring[i%window]; t != nil {
					<-t.Done()
				}
				t, err := d.Submit(ctx, i, i, SubmitOptions{})
				if err != nil {
					b.Fatal(err)
				}
				ring[i%window] = t
			}
			for _, t := range ring {
				if t != nil {
					<-t.Done()
				}
			}
		})
		b.Run(fmt.Sprintf("impl=dispatch/op=post/workers=%d", workers), func(b *testing.B) {
			sem := make(chan struct{}, window)
			d, err := New(nop, Config[int, int]{
				Workers:  workers,
				Capacity: 2 * window,
				OnDone:   func(Result[int, int]) { <-sem },
			})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close(context.Background())
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				sem <- struct{}{}
				if err := d.Post(i, i, SubmitOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			for range window { // every outstanding call has finished
				sem <- struct{}{}
			}
		})
	}
	b.Run("impl=goroutine/op=submit", func(b *testing.B) {
		g := &goDispatcher{pending: make(map[int]*goCall), exec: func(int, int) error { return nil }}
		defer g.wg.Wait()
		ring := make([]*goCall, window)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if c := ring[i%window]; c != nil {
				<-c.done
			}
			ring[i%window] = g.submit(i, i)
		}
		for _, c := range ring {
			if c != nil {
				<-c.done
			}
		}
	})
}

// naiveHeap is the naive baseline: a mutex, container/heap ordered by
// priority then arrival, and a map from key to entry for deduplication. It
// has no aging, waiters, deadlines or capacity.
type naiveHeap struct {
	mu  sync.Mutex
	h   naiveItems
	m   map[int]*naiveItem
	seq uint64
}

type naiveItem struct {
	key, val, prio int
	seq            uint64
	idx            int
}

type naiveItems []*naiveItem

func (h naiveItems) Len() int { return len(h) }
func (h naiveItems) Less(i, j int) bool {
	if h[i].prio != h[j].prio {
		return h[i].prio > h[j].prio
	}
	return h[i].seq < h[j].seq
}
func (h naiveItems) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *naiveItems) Push(x any) {
	it := x.(*naiveItem)
	it.idx = len(*h)
	*h = append(*h, it)
}
func (h *naiveItems) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

func newNaiveHeap() *naiveHeap { return &naiveHeap{m: make(map[int]*naiveItem)} }

func (q *naiveHeap) push(key, val, prio int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it := q.m[key]; it != nil {
		it.val = val
		if prio > it.prio {
			it.prio = prio
			heap.Fix(&q.h, it.idx)
		}
		return
	}
	q.seq++
	it := &naiveItem{key: key, val: val, prio: prio, seq: q.seq}
	heap.Push(&q.h, it)
	q.m[key] = it
}

func (q *naiveHeap) remove(key int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it := q.m[key]; it != nil {
		heap.Remove(&q.h, it.idx)
		delete(q.m, key)
	}
}

// mapBTree is the floor the submit path is held to: a mutex, a map and a
// google/btree insert, keyed like the ready index (virtual time, then
// arrival), with nothing else.
type mapBTree struct {
	mu    sync.Mutex
	t     *btree.BTreeG[*mapBTreeItem]
	m     map[int]*mapBTreeItem
	seq   uint64
	epoch time.Time
}

type mapBTreeItem struct {
	key, val int
	vt       int64
	seq      uint64
}

func newMapBTree() *mapBTree {
	return &mapBTree{
		t: btree.NewG(btreeDegree, func(a, b *mapBTreeItem) bool {
			if a.vt != b.vt {
				return a.vt < b.vt
			}
			return a.seq < b.seq
		}),
		m:     make(map[int]*mapBTreeItem),
		epoch: time.Now(),
	}
}

func (q *mapBTree) push(key, val, prio int, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it := q.m[key]; it != nil {
		it.val = val
		return
	}
	q.seq++
	it := &mapBTreeItem{key: key, val: val, seq: q.seq,
		vt: int64(now.Sub(q.epoch)) - int64(prio)*int64(time.Second)}
	q.t.ReplaceOrInsert(it)
	q.m[key] = it
}

func (q *mapBTree) remove(key int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it := q.m[key]; it != nil {
		q.t.Delete(it)
		delete(q.m, key)
	}
}

// goDispatcher is a goroutine-per-call dispatcher: a submission for a key
// whose call has not started replaces that call's value; anything else
// starts a goroutine.
type goDispatcher struct {
	mu      sync.Mutex
	pending map[int]*goCall
	exec    func(key, val int) error
	wg      sync.WaitGroup
}

type goCall struct {
	val  int
	err  error
	done chan struct{}
}

func (g *goDispatcher) submit(key, val int) *goCall {
	g.mu.Lock()
	if c := g.pending[key]; c != nil {
		c.val = val
		g.mu.Unlock()
		return c
	}
	c := &goCall{val: val, done: make(chan struct{})}
	g.pending[key] = c
	g.mu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.mu.Lock()
		delete(g.pending, key)
		val := c.val
		g.mu.Unlock()
		c.err = g.exec(key, val)
		close(c.done)
	}()
	return c
}

// BenchmarkRetryPath measures a call that fails once with a retryable error
// and then succeeds, end to end, one at a time: the retry waits in the delay
// index and is promoted by the dispatcher's one clock, so it costs no
// goroutine and no timer per call. Compare allocs/op with op=ok, the same
// call succeeding at once.
func BenchmarkRetryPath(b *testing.B) {
	for _, fail := range []bool{false, true} {
		name := "op=ok"
		if fail {
			name = "op=fail-once"
		}
		b.Run(name, func(b *testing.B) {
			failed := map[int]bool{}
			d, err := New(func(_ context.Context, k, _ int) error {
				if fail && !failed[k] {
					failed[k] = true
					return syscall.ECONNRESET
				}
				return nil
			}, Config[int, int]{
				Workers: 1,
				Retry:   RetryPolicy{InitialBackoff: time.Nanosecond, Jitter: JitterNone, BudgetRatio: math.Inf(1)},
			})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close(context.Background())
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				t, err := d.Submit(ctx, i, i, SubmitOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if r, _ := t.Wait(ctx); r.Attempts != 1+btoi(fail) {
					b.Fatalf("attempts %d", r.Attempts)
				}
				i++
			}
			if st := d.Stats(); fail && st.Retries != uint64(i) {
				b.Fatalf("retries %d, want %d", st.Retries, i)
			}
		})
	}
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

// BenchmarkSubmitFull measures a new key submitted into a dispatcher at its
// capacity of droppable calls. op=shed: the newcomer outranks the worst
// queued call, which is evicted (its waiter told Dropped) to make room.
// op=refuse: it does not, and gets ErrBackpressure at once.
func BenchmarkSubmitFull(b *testing.B) {
	const queued = 100_000
	for _, op := range []string{"shed", "refuse"} {
		b.Run(fmt.Sprintf("op=%s/queued=%d", op, queued), func(b *testing.B) {
			release := make(chan struct{})
			d, err := New(func(ctx context.Context, _, _ int) error {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}, Config[int, int]{Workers: 1, Capacity: queued + 1})
			if err != nil {
				b.Fatal(err)
			}
			if err := d.Post(-1, 0, SubmitOptions{}); err != nil {
				b.Fatal(err)
			}
			for d.Stats().InFlight != 1 {
				time.Sleep(100 * time.Microsecond)
			}
			for i := range queued {
				if err := d.Post(i, i, SubmitOptions{Priority: 0, Droppable: true}); err != nil {
					b.Fatal(err)
				}
			}
			prio := 0
			if op == "shed" {
				prio = 1 // outranks every queued call; each shed one is replaced by a droppable newcomer
			}
			runtime.GC()
			b.ReportAllocs()
			i := queued
			for b.Loop() {
				err := d.Post(i, i, SubmitOptions{Priority: prio, Droppable: true})
				if op == "shed" && err != nil || op == "refuse" && !errors.Is(err, ErrBackpressure) {
					b.Fatalf("op=%s: %v", op, err)
				}
				i++
				if op == "shed" && i%queued == 0 {
					prio++ // the backlog is all at the new level now: go one higher
				}
			}
			b.StopTimer()
			close(release)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = d.Close(ctx)
		})
	}
}

// BenchmarkTenants measures the new-key submission of BenchmarkSubmit
// (queued=100000) with the calls spread round-robin over tenants, each with
// a quota and an in-flight cap: a tenant lookup and the tenant's own B-tree.
func BenchmarkTenants(b *testing.B) {
	const queued = 100_000
	for _, tenants := range []int{1, 16} {
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			names := make([]string, tenants)
			cfg := Config[int, int]{Tenants: map[string]TenantConfig{}}
			for i := range names {
				names[i] = fmt.Sprint("plugin-", i)
				cfg.Tenants[names[i]] = TenantConfig{MaxQueued: 2 * queued, MaxInFlight: 4, Weight: 1 + i%3}
			}
			batch := benchBatch(queued)
			prios := benchPrios(queued+batch, 10)
			p := newParked(b, 0, queued+batch, prios, cfg)
			for i := range queued {
				if err := p.d.Post(i, i, SubmitOptions{Priority: prios[i], Tenant: names[i%tenants]}); err != nil {
					b.Fatal(err)
				}
			}
			p.next = queued
			runtime.GC()
			k0 := p.next
			n := loopBatched(b, batch, func(i int) {
				if err := p.d.Post(k0+i, i, SubmitOptions{Priority: prios[queued+i%batch], Tenant: names[i%tenants]}); err != nil {
					b.Fatal(err)
				}
			}, func(lo, hi int) { p.cancel(k0+lo, k0+hi) })
			p.fresh(n)
			p.close(b)
		})
	}
}

// BenchmarkDroppable measures BenchmarkSubmit's new-key Post of droppable
// calls, 1 000 queued: each enters the victims index a full dispatcher
// sheds from, the queue's (quota=none), and with a MaxQueued tenant's too
// (quota=tenant). The calls are of one priority (levels=1, as the
// drop-in's status patches), so that each is the newest of the index, or
// of ten (levels=10), so that some are not.
func BenchmarkDroppable(b *testing.B) {
	const queued = 1000
	for _, levels := range []int{1, 10} {
		for _, quota := range []string{"none", "tenant"} {
			b.Run(fmt.Sprintf("levels=%d/quota=%s", levels, quota), func(b *testing.B) {
				var cfg Config[int, int]
				tenant := ""
				if quota == "tenant" {
					tenant = "t"
					cfg.Tenants = map[string]TenantConfig{tenant: {MaxQueued: 2 * queued}}
				}
				batch := benchBatch(queued)
				prios := benchPrios(queued+batch, levels)
				opts := func(i int) SubmitOptions {
					return SubmitOptions{Priority: prios[i], Tenant: tenant, Droppable: true}
				}
				p := newParked(b, 0, queued+batch, prios, cfg)
				for i := range queued {
					if err := p.d.Post(i, i, opts(i)); err != nil {
						b.Fatal(err)
					}
				}
				p.next = queued
				runtime.GC()
				k0 := p.next
				n := loopBatched(b, batch, func(i int) {
					if err := p.d.Post(k0+i, i, opts(queued+i%batch)); err != nil {
						b.Fatal(err)
					}
				}, func(lo, hi int) { p.cancel(k0+lo, k0+hi) })
				p.fresh(n)
				p.close(b)
			})
		}
	}
}

// BenchmarkRateLimit is BenchmarkThroughput's Post with 16 workers and a
// rate limiter that always has a token, in each shape the dispatcher knows
// (see RateLimiter): none; a *rate.Limiter of rate.Inf, which takes
// reservations; and one that can only be waited on, whose tokens one
// goroutine of the dispatcher fetches and hands to the workers. What it
// times is what each shape costs per execution beyond the others.
func BenchmarkRateLimit(b *testing.B) {
	const window = 256
	nop := func(context.Context, int, int) error { return nil }
	for _, shape := range []struct {
		name string
		l    RateLimiter
	}{{"none", nil}, {"reserve", rate.NewLimiter(rate.Inf, 0)}, {"wait", openLimiter{}}, {"wait+allow", allowingLimiter{}}} {
		b.Run("limiter="+shape.name, func(b *testing.B) {
			sem := make(chan struct{}, window)
			d, err := New(nop, Config[int, int]{
				Workers:   16,
				Capacity:  2 * window,
				RateLimit: shape.l,
				OnDone:    func(Result[int, int]) { <-sem },
			})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close(context.Background())
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				sem <- struct{}{}
				if err := d.Post(i, i, SubmitOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			for range window { // every outstanding call has finished
				sem <- struct{}{}
			}
		})
	}
}

// openLimiter can only be waited on, and never makes anyone wait.
type openLimiter struct{}

func (openLimiter) Wait(context.Context) error { return nil }

// allowingLimiter is openLimiter that also says, without blocking, that
// every token is granted: the workers take them without the fetcher.
type allowingLimiter struct{ openLimiter }

func (allowingLimiter) Allow() bool { return true }
