// SPDX-License-Identifier: Apache-2.0

package kubernetes

import (
	"context"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/l4lb/l4lb/lb"
)

// What this package writes on Services.
const (
	// ConditionProgrammed says whether the Service's VIPs are in the
	// datapath of the writing box.
	ConditionProgrammed = Prefix + "Programmed"
	// Finalizer holds a deleted Service until its VIPs left the datapath,
	// so that the address is not handed to another Service while this
	// one's traffic still arrives.
	Finalizer = Prefix + "vip"
	// FieldManager names l4lb's writes in managedFields.
	FieldManager = "l4lb"
)

// writer writes status, Events and finalizers while this box holds the
// Lease; it runs the election itself. Every box translates and programs
// the same; only one writes, so boxes never fight over status.
func (s *Source) writer(ctx context.Context) {
	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.client.CoreV1().Events("")})
	defer bc.Shutdown()
	rec := bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "l4lb", Host: s.opts.Identity})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.boxReporter(ctx, rec)
	}()
	// Deferred after Shutdown, so it runs first: no Event after it.
	defer wg.Wait()

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: s.cfg.LeaseNamespace, Name: s.cfg.LeaseName},
		Client:     s.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: s.opts.Identity},
	}
	lead := func(lctx context.Context) {
		s.mu.Lock()
		s.leader = true
		s.statusAll = true
		s.mu.Unlock()
		s.log.Info("elected to write Service status", "lease", s.cfg.LeaseNamespace+"/"+s.cfg.LeaseName, "identity", s.opts.Identity)
		s.kickWriter()
		for {
			select {
			case <-lctx.Done():
				return
			case <-s.write:
			}
			if !s.ready() {
				continue
			}
			if retry := s.writeAll(lctx, rec); retry {
				// A conflict or error: the informer brings the new
				// version, or the next round tries again.
				go func() {
					select {
					case <-time.After(time.Second):
						s.kickWriter()
					case <-lctx.Done():
					}
				}()
			}
		}
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   s.opts.LeaseDuration,
			RenewDeadline:   s.opts.RenewDeadline,
			RetryPeriod:     s.opts.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            s.cfg.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: lead,
				OnStoppedLeading: func() {
					s.mu.Lock()
					was := s.leader
					s.leader = false
					s.mu.Unlock()
					if was {
						s.log.Info("no longer writing Service status", "lease", s.cfg.LeaseNamespace+"/"+s.cfg.LeaseName)
					}
				},
			},
		})
		if err != nil {
			s.log.Error("cannot run the status writer's election", "error", err)
			return
		}
		le.Run(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(s.opts.RetryPeriod):
		}
	}
}

// ready: the first full list is in and translated, so status can follow.
func (s *Source) ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced && s.result != nil
}

// writeAll brings the status and finalizer of every Service whose status
// may have changed (statusDirty, or all of them after statusAll) in line
// with the latest translation and what the datapath holds. It returns true
// when a write failed and should be tried again; the Services whose write
// failed stay marked.
func (s *Source) writeAll(ctx context.Context, rec record.EventRecorder) bool {
	v := s.current()
	s.mu.Lock()
	res := s.result
	programmed := s.programmed
	whole, dirty := s.statusAll, s.statusDirty
	s.statusAll, s.statusDirty = false, map[key]bool{}
	// The frontends of the Services this round looks at: all of them
	// only when it looks at every Service.
	var frontends map[key][]lb.Frontend
	if whole {
		frontends = maps.Clone(s.frontends)
	} else {
		frontends = make(map[key][]lb.Frontend, len(dirty))
		for k := range dirty {
			frontends[k] = s.frontends[k]
		}
	}
	s.mu.Unlock()
	var todo []*corev1.Service
	if whole {
		todo, _ = v.services.List(labels.Everything())
	} else {
		for k := range dirty {
			if svc, err := v.services.Services(k.ns).Get(k.name); err == nil {
				todo = append(todo, svc)
			}
		}
	}
	failed := map[key]bool{}
	defer func() {
		if len(failed) == 0 {
			return
		}
		s.mu.Lock()
		maps.Copy(s.statusDirty, failed)
		s.mu.Unlock()
	}()
	t := translator{cfg: s.cfg}
	for _, svc := range todo {
		k := keyOf(svc)
		if ctx.Err() != nil {
			// A new term starts with every Service.
			return false
		}
		mine := slices.Contains(svc.Finalizers, Finalizer)
		switch {
		case svc.DeletionTimestamp != nil:
			if !mine {
				continue
			}
			if slices.ContainsFunc(frontends[k], func(fe lb.Frontend) bool { return programmed[fe] }) {
				continue // still in the datapath
			}
			if !s.setFinalizer(ctx, svc, false) {
				failed[k] = true
				continue
			}
			s.mu.Lock()
			delete(s.frontends, k)
			s.mu.Unlock()
		case !t.selected(svc):
			// No longer ours (class or type changed): hand it back clean.
			if meta.FindStatusCondition(svc.Status.Conditions, ConditionProgrammed) != nil {
				c := svc.DeepCopy()
				meta.RemoveStatusCondition(&c.Status.Conditions, ConditionProgrammed)
				if !s.updateStatus(ctx, c) {
					failed[k] = true
					continue
				}
			}
			if mine && !s.setFinalizer(ctx, svc, false) {
				failed[k] = true
			}
		default:
			o := res.outcomes[k]
			if o == nil {
				continue
			}
			if !mine {
				if !s.setFinalizer(ctx, svc, true) {
					failed[k] = true
				}
				// The update comes back through the informer, and with
				// it the next round for status.
				continue
			}
			if !s.writeStatus(ctx, rec, svc, o, programmed) {
				failed[k] = true
			}
		}
	}
	return len(failed) > 0
}

// writeStatus writes ingress and condition when they differ from what the
// Service shows, and an Event when the condition's reason changes.
func (s *Source) writeStatus(ctx context.Context, rec record.EventRecorder, svc *corev1.Service, o *outcome, programmed map[lb.Frontend]bool) bool {
	want := svc.DeepCopy()
	reason, msg := o.reason, o.message
	all := len(o.frontends) > 0 && len(o.missing(programmed)) == 0
	if o.served() {
		if !all {
			reason, msg = ReasonPending, "not in the datapath (yet): another discovery source may serve the frontend, or the datapath refused it; see l4lbctl status"
		} else if reason == ReasonProgrammed {
			msg = "VIPs " + joinAddrs(o.vips) + " are programmed"
			if o.note != "" {
				msg += "; " + o.note
			}
		}
	}
	if reason != ReasonInvalidConfig {
		want.Status.LoadBalancer.Ingress = ingress(svc, o, programmed)
	}
	cond := metav1.Condition{
		Type:               ConditionProgrammed,
		Status:             metav1.ConditionFalse,
		Reason:             reason,
		Message:            truncate(msg, 32768),
		ObservedGeneration: svc.Generation,
	}
	if reason == ReasonProgrammed {
		cond.Status = metav1.ConditionTrue
	}
	old := meta.FindStatusCondition(svc.Status.Conditions, ConditionProgrammed)
	meta.SetStatusCondition(&want.Status.Conditions, cond)
	if reflect.DeepEqual(want.Status, svc.Status) {
		return true
	}
	if !s.updateStatus(ctx, want) {
		return false
	}
	if old == nil || old.Reason != cond.Reason || (cond.Reason == ReasonInvalidConfig && old.Message != cond.Message) {
		// Pending is the normal step before Programmed, not a warning.
		typ := corev1.EventTypeWarning
		if cond.Status == metav1.ConditionTrue || cond.Reason == ReasonPending {
			typ = corev1.EventTypeNormal
		}
		rec.Event(svc, typ, cond.Reason, cond.Message)
	}
	return true
}

// ingress lists the Service's VIPs that the datapath holds, and keeps the
// ones status already shows while they are still assigned: status is what
// a restarted box (or another box) reads back, so an address is only
// dropped from it when the Service no longer has it.
func ingress(svc *corev1.Service, o *outcome, programmed map[lb.Frontend]bool) []corev1.LoadBalancerIngress {
	shown := map[netip.Addr]bool{}
	for _, a := range statusIPs(svc) {
		shown[a] = true
	}
	vip := corev1.LoadBalancerIPModeVIP
	var out []corev1.LoadBalancerIngress
	for _, a := range o.vips {
		var ports []corev1.PortStatus
		on := false
		for _, fe := range o.frontends {
			if fe.Addr != a {
				continue
			}
			on = on || programmed[fe]
			proto := corev1.ProtocolTCP
			if fe.Proto == lb.UDP {
				proto = corev1.ProtocolUDP
			}
			ports = append(ports, corev1.PortStatus{Port: int32(fe.Port), Protocol: proto})
		}
		if !on && !shown[a] {
			continue
		}
		slices.SortFunc(ports, func(x, y corev1.PortStatus) int {
			if x.Port != y.Port {
				return int(x.Port - y.Port)
			}
			return strings.Compare(string(x.Protocol), string(y.Protocol))
		})
		out = append(out, corev1.LoadBalancerIngress{IP: a.String(), IPMode: &vip, Ports: ports})
	}
	return out
}

func (s *Source) updateStatus(ctx context.Context, svc *corev1.Service) bool {
	_, err := s.client.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, svc, metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			s.log.Warn("cannot write Service status", "service", svc.Namespace+"/"+svc.Name, "error", err)
		}
		return false
	}
	return true
}

// setFinalizer adds or removes Finalizer with an update of the Service
// (finalizers are not status).
func (s *Source) setFinalizer(ctx context.Context, svc *corev1.Service, on bool) bool {
	c := svc.DeepCopy()
	if on {
		c.Finalizers = append(c.Finalizers, Finalizer)
	} else {
		c.Finalizers = slices.DeleteFunc(c.Finalizers, func(f string) bool { return f == Finalizer })
	}
	_, err := s.client.CoreV1().Services(svc.Namespace).Update(ctx, c, metav1.UpdateOptions{FieldManager: FieldManager})
	if err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			s.log.Warn("cannot update the Service's finalizers", "service", svc.Namespace+"/"+svc.Name, "add", on, "error", err)
		}
		return false
	}
	if !on {
		s.log.Info("VIPs of a deleted Service left the datapath; released it", "service", svc.Namespace+"/"+svc.Name)
	}
	return true
}

func joinAddrs(as []netip.Addr) string {
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return strings.Join(out, ", ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
