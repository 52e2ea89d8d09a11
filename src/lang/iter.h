/*
 * iter.h - lazy iterators: the few values that make their items one at a
 * time, as Python's iterators do, where the rest of the language reads an
 * iterable whole (ops_iter_items).
 *
 * They are what Python's iterators are: zip, map, enumerate, filter and
 * reversed always make one (a zip of lists too, as in Python, so that
 * type() and isinstance() see Python's classes), and so do the iterators
 * that never end (itertools.count, cycle and repeat without times, which
 * no list can hold), islice of a lazy iterator and a generator
 * expression whose first iterable is one.  iter(x) makes one over any
 * iterable, and next(it) takes an item from any of them.  Their types
 * are named as Python's (zip, map, enumerate, filter, list_iterator,
 * range_iterator, list_reverseiterator, reversed, generator,
 * itertools.count, ...).
 *
 * Who reads them: a `for` loop and a comprehension pull one item per
 * step (so `for i in count(): ... break` ends, and Ctrl-C stops a loop
 * between items); `x in it`, any() and all() pull until they know,
 * polling Ctrl-C;
 * everything else (list(), sorted(), unpacking, a function of itertools
 * that makes a list) takes the items that are left through
 * ops_iter_items, which for an iterator that never ends is a ValueError
 * saying so, where Python would run until memory ran out.
 *
 * An iterator is consumed as it is read, and shared by reference: two
 * loops over one iterator share its items, as in Python.  Like a list it
 * is changed only by the thread run that made it (value.h, "who may
 * change a container"): a shard_map body cannot advance an iterator made
 * outside it.
 */
#ifndef SHMAP_ITER_H
#define SHMAP_ITER_H

#include "base/value.h"

/* Whether [v] is a lazy iterator. */
bool iter_is(const Value *v);

/* The next item of the lazy iterator [it]: a new reference; NULL with no
 * error set when it is exhausted (and stays so); NULL with the error set
 * on an error (a map's function raised, the iterator belongs to another
 * shard_map body run, out of memory). */
Value *iter_next(Value *it);

/* Whether the lazy iterator [it] is known never to end (count, repeat
 * without times, a cycle of something, an islice without stop of one of
 * these, a zip or map whose iterables all never end). */
bool iter_infinite(const Value *it);

/* The items left in the lazy iterator [it], as a new List (consuming
 * them), polling Ctrl-C; a ValueError for an infinite one ("cannot make
 * a list of the infinite iterator 'itertools.count'").  NULL with the
 * error set. */
Value *iter_drain(Value *it);

/* Up to [max] items of the lazy iterator [it], as a new List (fewer when
 * it ends): what unpacking `a, b = it` reads, one more than it needs, to
 * tell "too many values" as Python does.  NULL with the error set. */
Value *iter_take(Value *it, size_t max);

/* iter(x): [x] itself when it is a lazy iterator, else a new iterator
 * over the items of the iterable [x] (read now: a list's later changes
 * are not seen, unlike Python's list_iterator).  New reference, or NULL
 * with ops_iter_items's error ("'int' object is not iterable"). */
Value *iter_over(Value *x);

/* itertools.count(start, step): start, start+step, ... by repeated `+`,
 * as Python's.  [start] and [step] (borrowed) are numbers; else the
 * TypeError "a number is required".  New reference, or NULL. */
Value *iter_count(Value *start, Value *step);

/* itertools.cycle(iterable): its items again and again.  A finite
 * iterable is read at once; an infinite lazy one is passed through (its
 * items are all there will be).  New reference, or NULL. */
Value *iter_cycle(Value *iterable);

/* itertools.repeat(obj) without times: [obj] (borrowed) forever. */
Value *iter_repeat(Value *obj);

/* itertools.islice over the lazy iterator [src]: the items at
 * start, start+step, ... before [stop] (-1: no stop), consuming [src]
 * exactly as Python's islice does.  start >= 0, step >= 1 (checked by
 * the caller).  New reference, or NULL. */
Value *iter_islice(Value *src, int64_t start, int64_t stop, int64_t step);

/* zip(*iterables) when one of the [n] [srcs] (borrowed) is lazy: tuples
 * of their items side by side until one ends; with [fn] (borrowed, not
 * NULL) map(fn, *iterables): fn of those items.  New reference, or NULL
 * with the error set (an argument that is not iterable). */
Value *iter_zip(int n, Value *const *srcs, Value *fn);

/* reversed(x): an iterator over the items of [x] (read now) last first;
 * an iterator [x] is the TypeError "'zip' object is not reversible", as
 * Python's.  New reference, or NULL with the error set. */
Value *iter_reversed(Value *x);

/* filter(pred, src): the items of [src] for which pred(item) (None: the
 * item itself) is true, pulled as they are asked for.  [pred] and [src]
 * borrowed.  New reference, or NULL with the error set. */
Value *iter_filter(Value *pred, Value *src);

/* enumerate(src, start): (start, item), (start+1, ...). */
Value *iter_enumerate(Value *src, int64_t start);

/* A generator expression over the lazy iterator [src] (eval.c makes it):
 * for each item of [src], [step]([ctx], item, out) appends to the List
 * [out] the values the expression makes from it (none when its `if`
 * fails, several when it has more `for` clauses), 0 or -1 with the error
 * set; the iterator hands them out one by one.  [release]([ctx]) runs
 * when the iterator is freed.  New reference, or NULL with the error set
 * ([ctx] released then too). */
typedef int (*IterStep)(void *ctx, Value *item, Value *out);
Value *iter_gen(Value *src, IterStep step, void (*release)(void *ctx), void *ctx);

#endif
