// SPDX-License-Identifier: Apache-2.0

// Package health owns the "backend up/down" input of the control plane. The
// daemon hands it the desired services; it keeps one prober per checked
// (service, backend), and tells the daemon when a backend changes state so
// that the next desired state leaves a down backend out of its service's
// Maglev table (only that backend's slots move) and takes it back once it
// recovers. It never touches the datapath itself.
//
//	lb/daemon ──Update(services, targets)──> Manager ──one prober per backend──> Checker (tcp|http|udp|none)
//	lb/daemon <──Events() / States() / Up()── Manager
//
// # Where a probe goes
//
// A [Target] is the address a probe dials plus how its socket is set up: an
// optional SO_MARK and an optional source address. That lets the daemon
// express the two ways a backend is reached:
//
//   - SNAT services: [Direct] dials the backend's own address and port.
//   - DSR services: [ThroughVIP] dials the VIP and port, as clients do, with a
//     mark that names the backend. A tc egress program recognises the mark
//     and dispatches the probe to exactly that backend, whose reply comes
//     straight back from the VIP. This tests what clients use (the dispatch,
//     the VIP bound on the backend, the backend companion) and not only that
//     the backend's own address answers. Setting a mark needs CAP_NET_ADMIN.
//
// # State rules
//
// A backend is Up or Down. Rise consecutive successful probes bring a Down
// backend up; Fall consecutive failures take an Up backend down. A new
// prober starts in Options.Initial, Up unless told otherwise: when l4lbd
// restarts it adopts the programmed tables, and starting every backend Down
// would empty every table until the first probes rise, while starting Up
// only keeps a truly dead backend in for Fall probes, as before the restart.
// A prober restarted because its check or target changed keeps its state and
// flap history, and starts counting consecutive results afresh.
//
// Probes are spread in time: the first comes at a random point within the
// first tenth of the interval, and each next one a jittered interval (±10%)
// after the previous one started, so that probers started together (a
// restart, a reload that adds many backends) do not probe in lockstep.
//
// Flap damping only ever delays a return, never a removal, because keeping a
// failing backend in serves errors while keeping a healthy one out only costs
// capacity. Every state change is remembered for Damping.Window. When a
// return to Up would make more than Damping.MaxTransitions changes within the
// window, the backend stays Down for Damping.HoldDown instead (probing goes
// on). When the hold ends it comes back at the next successful probe,
// provided the last Rise probes succeeded, and its flap history starts
// afresh: the hold was the penalty. With the defaults (4 changes in 5
// minutes, 2 minutes hold) a backend may blip twice in five minutes; the
// third return waits two minutes.
//
// Backends of a service whose check type is none get no prober and are
// always up as far as this package is concerned.
package health
