// Package prefetch asks the CPU to start loading a cache line ahead of a load that
// would otherwise wait for memory: for tables far larger than the cache (the window
// index, the dedupe set), whose callers know a few events ahead which slots they
// will touch.
package prefetch
