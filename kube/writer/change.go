package writer

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"

	"github.com/coalescer/dispatch"
)

// call runs the user's change c on obj in a goroutine of its own and waits
// for it until ctx ends, so that whatever c does, the writer goes on:
//
//   - an error ends the write Failed with it (never retried);
//   - a panic, or runtime.Goexit, ends it Failed with a
//     *dispatch.PanicError (Callback "change"), as the dispatcher's own
//     callbacks do;
//   - a change that blocks holds its write until ctx ends (the write's
//     deadline, its cancellation, Close), and is then abandoned: obj is
//     dropped, never sent;
//   - a change may call the Writer: Set, Submit and the rest as anywhere,
//     and Close, which then does not wait for the change (ErrReentrant).
//
// Options.Merge runs here too, inside the merged change, never under the
// dispatcher's lock.
func (w *Writer[O]) call(ctx context.Context, c Change[O], obj O) error {
	if _, ok := ctx.(inlineCtx); ok {
		return w.callHere(c, obj)
	}
	done := make(chan error, 1)
	go func() {
		id := goid()
		w.changing.Store(id, struct{}{})
		defer w.changing.Delete(id)
		normal := false
		defer func() {
			if !normal {
				v := recover()
				if v == nil {
					v = dispatch.ErrGoexit
				}
				done <- permanent(&dispatch.PanicError{Callback: "change", Value: v, Stack: debug.Stack()})
			}
		}()
		err := c(obj)
		normal = true
		if err != nil {
			err = permanent(fmt.Errorf("writer: change of %s: %w", key(obj), err))
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("writer: change of %s abandoned: %w", key(obj), context.Cause(ctx))
	}
}

// inlineCtx makes call run the change on the calling goroutine: Set's
// no-op test, which runs the caller's code on the caller's goroutine.
type inlineCtx struct{ context.Context }

var inline context.Context = inlineCtx{context.Background()}

func (w *Writer[O]) callHere(c Change[O], obj O) error {
	if err := c(obj); err != nil {
		return permanent(fmt.Errorf("writer: change of %s: %w", key(obj), err))
	}
	return nil
}

// inChange reports whether the calling goroutine runs a change.
func (w *Writer[O]) inChange() bool {
	_, ok := w.changing.Load(goid())
	return ok
}

// changes is the set of goroutines running a change, by goroutine id.
type changes = sync.Map

// goid returns the calling goroutine's id, from its stack's header
// ("goroutine 42 [running]:"): the one way Go offers, used only to tell a
// change's goroutine from others.
func goid() uint64 {
	var buf [40]byte
	s := strings.TrimPrefix(string(buf[:runtime.Stack(buf[:], false)]), "goroutine ")
	if i := strings.IndexByte(s, ' '); i > 0 {
		s = s[:i]
	}
	id, _ := strconv.ParseUint(s, 10, 64)
	return id
}
