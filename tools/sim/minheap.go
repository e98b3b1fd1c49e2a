package sim

import "container/heap"

// minHeap is container/heap over a slice of T in the order less gives, so
// that each of the simulator's queues is its element type and an order
// (with container/heap's algorithm: ties come out as they always did).
type minHeap[T any] struct {
	items []T
	less  func(a, b T) bool
}

func (h *minHeap[T]) push(x T) { heap.Push((*heapOf[T])(h), x) }
func (h *minHeap[T]) pop() T   { return heap.Pop((*heapOf[T])(h)).(T) }
func (h *minHeap[T]) len() int { return len(h.items) }

// first is the least item; ok is false when the heap is empty.
func (h *minHeap[T]) first() (x T, ok bool) {
	if len(h.items) == 0 {
		return x, false
	}
	return h.items[0], true
}

// heapOf is minHeap as container/heap's heap.Interface, kept off minHeap's
// own methods.
type heapOf[T any] minHeap[T]

func (h *heapOf[T]) Len() int           { return len(h.items) }
func (h *heapOf[T]) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h *heapOf[T]) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *heapOf[T]) Push(x any)         { h.items = append(h.items, x.(T)) }
func (h *heapOf[T]) Pop() any {
	last := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return last
}
