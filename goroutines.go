package dispatch

import (
	"time"

	"github.com/coalescer/dispatch/internal/due"
	"github.com/coalescer/dispatch/internal/goid"
)

// This file is the dispatcher's own lifecycle: the goroutines it starts,
// and Close, which stops them. Every goroutine has an owner that waits for
// it: d.wg, which Close waits on. The dispatcher also knows which
// goroutines it would wait for — its own, and callers running a call inline
// — so that a callback on one of them that calls Close or SetMode gets
// ErrReentrant instead of waiting for itself.

// role is what one of the dispatcher's goroutines does.
type role uint8

const (
	roleWorker   role = iota // runs ready calls
	roleClock                // expires deadlines, ends backoffs, checks the fallback policy
	roleNotifier             // runs the hooks and observer events of what the clock ends
	roleFetcher              // waits for tokens of a limiter that can only be waited on
)

// launch starts the goroutines. It runs once, on the first submission: a
// Dispatcher that is never used starts nothing.
func (d *Dispatcher[K, T]) launch() {
	d.started = true
	d.clk.timer = time.NewTimer(time.Hour)
	d.clk.timer.Stop()
	for range d.cfg.Workers {
		d.spawn(roleWorker)
	}
	d.spawn(roleClock)
	d.spawn(roleNotifier)
	if d.gate.tokens.NeedsFetcher() {
		d.spawn(roleFetcher)
	}
	if d.fallback != nil {
		d.due.Set(due.Check, d.fallback.Start(d.clk.now()))
	}
	d.due.Rearm() // anything recorded before there was a timer
}

// spawn starts one goroutine of role r. If user code ends it with
// runtime.Goexit, a new one takes its place, unless the dispatcher has
// stopped.
func (d *Dispatcher[K, T]) spawn(r role) {
	d.wg.Add(1)
	go func() {
		id := goid.ID()
		d.mu.Lock()
		d.owned.add(id)
		d.mu.Unlock()
		returned := false
		defer func() {
			if r := recover(); r != nil {
				crash(r) // never take the lock the panic may have left held
			}
			d.mu.Lock()
			d.owned.drop(id)
			d.wake.kick()
			if !returned && !d.stopped {
				d.spawn(r) // before Done, so that Close cannot miss it
			}
			d.mu.Unlock()
			d.wg.Done()
		}()
		switch r {
		case roleWorker:
			d.worker(id)
		case roleClock:
			d.clock()
		case roleNotifier:
			d.notifier()
		case roleFetcher:
			d.fetcher()
		}
		returned = true
	}()
}

// notifier runs the completion hooks and observer events of calls the
// clock ended, so that a slow or blocked callback never holds up the clock
// — and with it every deadline and backoff. It takes the lock itself.
func (d *Dispatcher[K, T]) notifier() {
	var batch outbox[K, T]
	d.mu.Lock()
	for {
		for d.notify.empty() && !d.stopped {
			d.notifyCond.Wait()
		}
		if d.notify.empty() {
			break
		}
		batch, d.notify = d.notify, batch
		d.mu.Unlock()
		d.tell.deliver(&batch)
		d.mu.Lock()
	}
	d.mu.Unlock()
}
