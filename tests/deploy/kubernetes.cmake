# deploy/kubernetes tests (label deploy): the manifests against kubernetes-validate (strict,
# Kubernetes 1.32) and our CRD schemas, broken variants included; the Dockerfiles' static checks
# (runtime packages from `ldd snapserve`); and the LeaderWorkerSet start-up path as 3 local
# processes configured from the rendered lws-tp overlay (needs the default model, else skipped).
add_test(NAME test_k8s_manifests
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/deploy/test_kubernetes_manifests.py ${CMAKE_SOURCE_DIR}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(test_k8s_manifests PROPERTIES LABELS "deploy" TIMEOUT 300)

add_test(NAME test_k8s_dockerfile
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/deploy/test_kubernetes_dockerfile.py
                 $<TARGET_FILE:snapserve> ${CMAKE_SOURCE_DIR}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(test_k8s_dockerfile PROPERTIES LABELS "deploy" TIMEOUT 300)

add_test(NAME test_k8s_lws_startup
         COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/deploy/test_kubernetes_lws_startup.py
                 $<TARGET_FILE:snapserve> ${CMAKE_SOURCE_DIR}
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(test_k8s_lws_startup PROPERTIES LABELS "deploy" TIMEOUT 600 SKIP_RETURN_CODE 77
                     RESOURCE_LOCK cores ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")

# The lws-tp-gpu overlay's group the same way, on the host twin's snapserve (kernels/cuda/host:
# `serve --device cuda --tp 3` with the device path on the CPU), in CUDA builds.
if(TARGET snapserve_host_twin)
  add_test(NAME test_k8s_lws_gpu_startup
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/deploy/test_kubernetes_lws_startup.py
                   $<TARGET_FILE:snapserve_host_twin> ${CMAKE_SOURCE_DIR} lws-tp-gpu
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_k8s_lws_gpu_startup PROPERTIES LABELS "deploy;host_twin" TIMEOUT 600 SKIP_RETURN_CODE 77
                       RESOURCE_LOCK cores ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
endif()
