"""Envoy CPU per request that prefix-router adds for hostile 1 MB bodies, against a
plain 1 MB prompt (issue 21's "CPU per MiB within 3x a plain prompt's", in a real Envoy).

Runs Envoy 1.40 (.venv, one worker) with envoy/envoy-round-robin.yaml (no filter) and
envoy/envoy.yaml (the filter, target/prefix_router.wasm) in turn, four instant backend
simulators behind each; sends each body N times (default 200) on one connection and reads
Envoy's own CPU time (utime + stime from /proc) around them. Prints the filter's counters and,
per body, Envoy's CPU per request without and with the filter, the difference, and that
difference against the plain prompt's. The instant backends answer some dense bodies 400
(they are not chats); that is the backend's answer, passed through.

    ./build.sh wasm && ./build.sh native && N=200 python3 tools/hostile-cpu.py
"""
import http.client, os, signal, subprocess, sys, time
ROOT=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVOY=ROOT+'/.venv/bin/envoy'
N=int(os.environ.get('N','40'))
def text(n):
    w=["the","cache","prefix","token","replica","model","route","load"]
    s=[];i=0;L=0
    while L<n:
        x=w[(i*7+i//3)%8]; s.append(x); L+=len(x)+1; i+=1
    return ' '.join(s)[:n]
SIZE=1_000_000
def wrap(inner): return ('{"model":"m","messages":[%s]}' % inner).encode()
def user(c): return wrap('{"role":"user","content":%s}' % c)
def lst(item,n): return ','.join([item]*n)
bodies=[
 ('plain prompt', user('"%s"' % text(SIZE-60))),
 ('{} messages', wrap(lst('{}', SIZE//3))),
 ('short messages', wrap(lst('{"role":"user","content":"a"}', SIZE//30))),
 ('number parts', user('[%s]' % lst('0', SIZE//2))),
 ('{} parts', user('[%s]' % lst('{}', SIZE//3))),
 ('text parts', user('[%s]' % lst('{"type":"text","text":"a"}', SIZE//27))),
 ('unsorted part objects', user('[[%s]]' % lst('{"b":0,"a":0}', SIZE//14))),
 ('escapes', user('"%s"' % ('\\n'*(SIZE//2-40)))),
]
for n,b in bodies: assert len(b) < 1048576, (n, len(b))
def start_backends():
    ps=[]
    for p in range(18001,18005):
        ps.append(subprocess.Popen([ROOT+'/target/native/prefix-router-backend','--listen',f'127.0.0.1:{p}','--name',f'b{p}','--instant'],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL))
    time.sleep(0.5); return ps
def start_envoy(cfg):
    p=subprocess.Popen([ENVOY,'-c',cfg,'--concurrency','1','--log-level','warn'],cwd=ROOT,stdout=subprocess.DEVNULL,stderr=open('/tmp/envoy-cpu.log','w'))
    for _ in range(100):
        try:
            c=http.client.HTTPConnection('127.0.0.1',9901,timeout=1); c.request('GET','/ready'); r=c.getresponse(); r.read()
            if r.status==200: break
        except Exception: pass
        time.sleep(0.1)
    time.sleep(0.5); return p
TICK=os.sysconf('SC_CLK_TCK')
def cpu(pid):
    f=open(f'/proc/{pid}/stat').read().rsplit(')',1)[1].split()
    return (int(f[11])+int(f[12]))/TICK
def run(body, pid):
    c=http.client.HTTPConnection('127.0.0.1',10000,timeout=30)
    for k in range(N+5):
        if k==5: t0=cpu(pid)
        c.request('POST','/v1/chat/completions',body=body,headers={'content-type':'application/json'})
        r=c.getresponse(); r.read()
    t1=cpu(pid)
    c.close()
    return (t1-t0)/N*1e3
def stats():
    c=http.client.HTTPConnection('127.0.0.1',9901,timeout=2); c.request('GET','/stats?filter=prefix_router'); r=c.getresponse(); return r.read().decode()
bk=start_backends()
res={}
try:
    for label,cfg in [('rr','envoy/envoy-round-robin.yaml'),('pr','envoy/envoy.yaml')]:
        for rnd in range(2):
            e=start_envoy(cfg)
            try:
                for n,b in bodies:
                    res.setdefault((label,n),[]).append(run(b, e.pid))
                if label=='pr' and rnd==0:
                    print('\n'.join(l for l in stats().splitlines() if 'fallback' in l or 'routed' in l))
            finally:
                e.send_signal(signal.SIGTERM); e.wait()
finally:
    for p in bk: p.kill()
plain_added=min(res[('pr','plain prompt')])-min(res[('rr','plain prompt')])
print(f"Envoy CPU ms per request (process utime+stime over {N} requests, min of 2 rounds)")
print(f"{'body':<24}{'bytes':>9}{'rr ms':>8}{'pr ms':>8}{'added ms':>10}{'x plain':>9}")
for n,b in bodies:
    rr=min(res[('rr',n)]); pr=min(res[('pr',n)]); add=pr-rr
    print(f"{n:<24}{len(b):>9}{rr:>8.2f}{pr:>8.2f}{add:>10.2f}{add/plain_added:>9.2f}")
